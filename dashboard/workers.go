package dashboard

import (
	"cmp"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/driver"
)

// MaxWorkersShown is the most workers the workers page shows.
const MaxWorkersShown = 500

type workerRow struct {
	ap.WorkerInfo
	Queues string
}

type workersPage struct {
	base
	Rows []workerRow
	More int
	Err  string
}

// workersPage lists the running platforms that share the backend's store,
// from the records their heartbeats write (Platform.Workers).
func (d *Dashboard) workersPage(w http.ResponseWriter, r *http.Request) {
	data := &workersPage{base: d.newBase(w, r, "Workers", "")}
	data.Refresh = true
	list, err := d.p.Workers(r.Context())
	if err != nil {
		data.Err = err.Error()
	}
	if len(list) > MaxWorkersShown {
		data.More = len(list) - MaxWorkersShown
		list = list[:MaxWorkersShown]
	}
	for _, wi := range list {
		data.Rows = append(data.Rows, workerRow{WorkerInfo: wi, Queues: strings.Join(wi.Queues, ", ")})
	}
	d.render(w, r, "workers.html", http.StatusOK, data)
}

// The spans the history page offers.
var historySpans = []struct {
	Name string
	D    time.Duration
}{{"1h", time.Hour}, {"6h", 6 * time.Hour}, {"24h", 24 * time.Hour}}

type historyTotal struct {
	Queue, Type                     string
	QueueLink                       string
	Succeeded, Failed, DeadLettered int64
	FailedPct                       string
}

type historyMinute struct {
	Start                           time.Time
	Succeeded, Failed, DeadLettered int64
}

type historyPage struct {
	base
	Span    string
	Spans   []string
	Totals  []historyTotal
	Minutes []historyMinute
	Err     string
	// Cut says the read was cut at ap.MaxHistoryReadBytes; CutFrom is
	// then the first minute read (the totals start there), zero when no
	// minute read parsed.
	Cut     bool
	CutFrom time.Time
	// ReadMiB is ap.MaxHistoryReadBytes in MiB.
	ReadMiB int
}

// MaxHistoryRows bounds the queue and type rows of the history page.
const MaxHistoryRows = 500

// historyPage shows the throughput history (Platform.History): totals by
// queue and type over a span (span=1h, 6h or 24h), and the attempts per
// minute of the last hour, newest first.
func (d *Dashboard) historyPage(w http.ResponseWriter, r *http.Request) {
	span := r.URL.Query().Get("span")
	dur := time.Duration(0)
	for _, s := range historySpans {
		if s.Name == span {
			dur = s.D
		}
	}
	if span == "" {
		span, dur = "1h", time.Hour
	}
	if dur == 0 {
		d.fail(w, r, http.StatusBadRequest, "Not a span: "+visible(span, false)+" (1h, 6h or 24h).")
		return
	}
	data := &historyPage{base: d.newBase(w, r, "History", ""), Span: span, ReadMiB: ap.MaxHistoryReadBytes >> 20}
	data.Refresh = true
	for _, s := range historySpans {
		data.Spans = append(data.Spans, s.Name)
	}
	now := time.Now()
	hr, err := d.p.ReadHistory(r.Context(), now.Add(-dur))
	if err != nil {
		data.Err = err.Error()
	}
	mins := hr.Minutes
	data.Cut = hr.Cut
	if hr.Cut && len(mins) > 0 {
		data.CutFrom = mins[0].Start
	}
	totals := map[[2]string]*historyTotal{}
	lastHour := now.Add(-time.Hour)
	for _, m := range mins {
		hm := historyMinute{Start: m.Start}
		for _, s := range m.Series {
			k := [2]string{s.Queue, s.Type}
			t := totals[k]
			if t == nil {
				if len(totals) >= MaxHistoryRows {
					continue
				}
				t = &historyTotal{Queue: s.Queue, Type: s.Type}
				if driver.CheckQueue(s.Queue) == nil {
					t.QueueLink = d.link("/queue", "q", s.Queue)
				}
				totals[k] = t
			}
			t.Succeeded += s.Succeeded
			t.Failed += s.Failed
			t.DeadLettered += s.DeadLettered
			hm.Succeeded += s.Succeeded
			hm.Failed += s.Failed
			hm.DeadLettered += s.DeadLettered
		}
		if !m.Start.Before(lastHour.Truncate(time.Minute)) {
			data.Minutes = append(data.Minutes, hm)
		}
	}
	slices.Reverse(data.Minutes)
	for _, t := range totals {
		if n := t.Succeeded + t.Failed + t.DeadLettered; n > 0 {
			t.FailedPct = percent(t.Failed+t.DeadLettered, n)
		}
		data.Totals = append(data.Totals, *t)
	}
	slices.SortFunc(data.Totals, func(a, b historyTotal) int {
		return cmp.Or(strings.Compare(a.Queue, b.Queue), strings.Compare(a.Type, b.Type))
	})
	d.render(w, r, "history.html", http.StatusOK, data)
}

// percent is part of whole in per cent, one decimal.
func percent(part, whole int64) string {
	return strconv.FormatFloat(float64(part)*100/float64(whole), 'f', 1, 64) + " %"
}
