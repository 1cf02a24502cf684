package dashboard

import (
	"errors"
	"net/http"
	"slices"
	"strconv"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/driver"
)

// jobStates are the states the jobs page filters by, in the order of a
// job's life.
var jobStates = []ap.JobState{ap.StateWaiting, ap.StateScheduled, ap.StateRunning, ap.StateRetrying, ap.StateSucceeded, ap.StateDeadLettered, ap.StateCancelled}

// ---- tracked jobs by state ----

type stateCount struct {
	State   string
	N       int
	Link    string
	Current bool
}

type jobRow struct {
	ID, Type, Queue, State, Reason, Error, Worker string
	Tries                                         int
	Updated                                       time.Time
	Link                                          string
}

type jobsPage struct {
	base
	Q, State, Type string
	Counts         []stateCount
	Total          int
	CountsPartial  bool
	CountsScanned  int
	CountsErr      string
	Rows           []jobRow
	ListErr        string
	Scanned        int
	Next, First    string
	States         []string
	// Source is where the rows were read from ("broker" or "status"),
	// Partial that the broker showed only part of the state, Unreadable
	// how many records or messages were skipped.
	Source     string
	Partial    bool
	Unreadable int
}

func stateNames() []string {
	out := make([]string, len(jobStates))
	for i, s := range jobStates {
		out[i] = string(s)
	}
	return out
}

// jobsPage lists the jobs of a queue (q; none: every queue) by state
// (state) and type (type), from where Platform.Jobs reads them (source:
// "broker", "status", or empty for where the jobs are), a page at a time
// (cursor), with the queue's counts by state from the status records.
func (d *Dashboard) jobsPage(w http.ResponseWriter, r *http.Request) {
	query := r.URL.Query()
	q := query.Get("q")
	if q != "" {
		if err := driver.CheckQueue(q); err != nil {
			d.fail(w, r, http.StatusBadRequest, "Not a queue name: "+err.Error())
			return
		}
	}
	state, typ, cursor, source := query.Get("state"), query.Get("type"), query.Get("cursor"), query.Get("source")
	if state != "" && !slices.Contains(jobStates, ap.JobState(state)) {
		d.fail(w, r, http.StatusBadRequest, "Not a job state: "+visible(state, false)+".")
		return
	}
	if source != "" && source != string(ap.SourceStatus) && source != string(ap.SourceBroker) {
		d.fail(w, r, http.StatusBadRequest, "Not a source of jobs (broker, status): "+visible(source, false)+".")
		return
	}
	title := "Jobs"
	if q != "" {
		title = "Jobs of " + q
	}
	data := &jobsPage{base: d.newBase(w, r, title, q), Q: q, State: state, Type: typ, States: stateNames()}
	ctx := r.Context()
	if c, err := d.p.JobCounts(ctx, q); err != nil {
		data.CountsErr = err.Error()
	} else {
		data.CountsPartial, data.CountsScanned = !c.Complete, c.Scanned
		sum := map[ap.JobState]int{}
		for _, m := range c.ByQueue {
			for s, n := range m {
				sum[s] += n
			}
		}
		for _, s := range jobStates {
			data.Counts = append(data.Counts, stateCount{State: string(s), N: sum[s], Current: string(s) == state,
				Link: d.link("/jobs", "q", q, "state", string(s), "type", typ)})
			data.Total += sum[s]
		}
	}
	n := DefaultJobsPage
	if v, err := strconv.Atoi(query.Get("n")); err == nil && v > 0 {
		n = min(v, MaxPageSize)
	}
	pg, err := d.p.Jobs(ctx, ap.JobsQuery{Queue: q, State: ap.JobState(state), Type: typ, Limit: n, Cursor: cursor, Source: ap.JobsSource(source)})
	switch {
	case errors.Is(err, ap.ErrBadCursor):
		d.fail(w, r, http.StatusBadRequest, "That page's cursor is not one this dashboard made.")
		return
	case err != nil:
		data.ListErr = err.Error()
	}
	data.Source, data.Partial, data.Unreadable = string(pg.Source), pg.Partial, pg.Unreadable
	for _, st := range pg.Jobs {
		row := jobRow{
			ID: st.ID, Type: st.Type, Queue: st.Queue, State: string(st.State), Reason: string(st.Reason),
			Error: firstLine(st.Error, 160), Worker: st.Worker, Tries: st.Tries, Updated: st.UpdatedAt,
			Link: d.link("/job", "id", st.ID),
		}
		if pg.Source == ap.SourceBroker {
			row.Updated = st.EnqueuedAt // a message has no status to have been updated
		}
		data.Rows = append(data.Rows, row)
	}
	data.Scanned = pg.Scanned
	if pg.Next != "" {
		data.Next = d.link("/jobs", "q", q, "state", state, "type", typ, "source", source, "cursor", pg.Next, "n", nz(query.Get("n")))
	}
	if cursor != "" {
		data.First = d.link("/jobs", "q", q, "state", state, "type", typ, "source", source, "n", nz(query.Get("n")))
	}
	d.render(w, r, "jobs.html", http.StatusOK, data)
}

// DefaultJobsPage is how many jobs a page of the jobs listing shows.
const DefaultJobsPage = 50

// ---- one job ----

type jobPage struct {
	base
	St         ap.JobStatus
	QueueLink  string
	LetterLink string
	ResultCut  bool
	HistoryMax int
}

// jobPage shows a tracked job's status by its ID (id), with a link to its
// dead letter when it is dead-lettered.
func (d *Dashboard) jobPage(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("id")
	if id == "" {
		d.fail(w, r, http.StatusBadRequest, "Give a job ID (id=…).")
		return
	}
	st, err := d.p.Status(r.Context(), id)
	if errors.Is(err, ap.ErrJobNotFound) {
		d.fail(w, r, http.StatusNotFound, "No status for job "+visible(id, false)+": unknown, on a queue that does not track status, or past its retention. "+
			"A dead letter may still hold it: open its queue's dead letters.")
		return
	}
	if err != nil {
		d.fail(w, r, http.StatusBadGateway, "Reading the job's status: "+err.Error())
		return
	}
	queue := ""
	if driver.CheckQueue(st.Queue) == nil {
		queue = st.Queue // a record's queue is whatever its writer wrote: linked only when it is a queue name
	}
	data := &jobPage{base: d.newBase(w, r, "Job "+visible(id, false), queue), St: st, ResultCut: len(st.Result) < st.ResultSize, HistoryMax: ap.MaxStatusHistory}
	if queue != "" {
		data.QueueLink = d.link("/jobs", "q", queue)
		if st.State == ap.StateDeadLettered || st.State == ap.StateCancelled {
			data.LetterLink = d.link("/letter", "q", queue, "id", st.ID)
		}
	}
	d.render(w, r, "job.html", http.StatusOK, data)
}
