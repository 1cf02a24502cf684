package dashboard

import (
	"net/http"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/driver"
)

// MaxSchedulesShown is the most schedules the schedules page shows.
const MaxSchedulesShown = 500

type scheduleRow struct {
	ap.ScheduleInfo
	QueueLink string // empty when the record's queue is not a queue name
}

type schedulesPage struct {
	base
	Rows []scheduleRow
	More int
	Err  string
}

// schedulesPage lists the schedules some process has run on the backend,
// as the process that last started each published it: spec, job type and
// queue, catch-up, last and next tick, and who started it when.
func (d *Dashboard) schedulesPage(w http.ResponseWriter, r *http.Request) {
	data := &schedulesPage{base: d.newBase(w, r, "Schedules", "")}
	list, err := d.p.Schedules(r.Context())
	if err != nil {
		data.Err = err.Error()
	}
	if len(list) > MaxSchedulesShown {
		data.More = len(list) - MaxSchedulesShown
		list = list[:MaxSchedulesShown]
	}
	for _, s := range list {
		row := scheduleRow{ScheduleInfo: s}
		if driver.CheckQueue(s.Queue) == nil {
			row.QueueLink = d.link("/queue", "q", s.Queue)
		}
		data.Rows = append(data.Rows, row)
	}
	d.render(w, r, "schedules.html", http.StatusOK, data)
}
