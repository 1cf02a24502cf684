package dashboard

import (
	"errors"
	"net/http"
	"strconv"

	ap "github.com/asyncplatform/asyncplatform"
)

// WorkflowPageSteps is the most steps the workflow page shows (and reads)
// at once; Platform.WorkflowStatusPage bounds the bytes it reads.
const WorkflowPageSteps = 100

// MaxDepsShown is the most dependencies a step's row names; the rest are
// counted.
const MaxDepsShown = 10

// workflowPage is the data of workflow.html.
type workflowPage struct {
	base
	St ap.WorkflowPage
	// State is the whole workflow's (running, succeeded, or ended with a
	// step not succeeded) when the page holds every step, else empty.
	State     string
	Steps     []workflowStep
	First     int // the number of the first step shown, from 1
	Last      int // the number of the last step shown
	Cut       bool
	NextLink  string
	PrevLink  string
	PageSteps int // WorkflowPageSteps
}

// workflowStep is one row of workflow.html.
type workflowStep struct {
	ap.StepStatus
	Deps     []string // the first MaxDepsShown dependencies
	MoreDeps int      // the others
	JobLink  string   // the step's job page (its status, on a queue that tracks it)
}

// workflowPage shows a workflow (or a batch with a callback) by its ID
// (id): its name, whether it was cancelled, and a page of its steps from
// the offset-th (offset), each with its state, dead-letter reason,
// attempt, dependencies, result size and job. A page reads at most
// WorkflowPageSteps step records (Platform.WorkflowStatusPage bounds their
// bytes); the workflow's own state is shown when one page holds every
// step. Every string comes from the store and is escaped by the template.
func (d *Dashboard) workflowPage(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("id")
	if id == "" {
		d.fail(w, r, http.StatusBadRequest, "Give a workflow ID (id=…).")
		return
	}
	offset := 0
	if s := r.URL.Query().Get("offset"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 || n > ap.MaxWorkflowSteps {
			d.fail(w, r, http.StatusBadRequest, "Not a step offset: "+visible(s, false)+" (0 to "+strconv.Itoa(ap.MaxWorkflowSteps)+").")
			return
		}
		offset = n
	}
	pg, err := d.p.WorkflowStatusPage(r.Context(), id, offset, WorkflowPageSteps)
	if errors.Is(err, ap.ErrWorkflowNotFound) {
		d.fail(w, r, http.StatusNotFound, "No workflow "+visible(id, false)+": unknown, or past its retention.")
		return
	}
	if err != nil {
		d.fail(w, r, http.StatusBadGateway, "Reading the workflow: "+err.Error())
		return
	}
	if offset > 0 && offset >= pg.Total {
		d.fail(w, r, http.StatusBadRequest, "Not a step offset: "+strconv.Itoa(offset)+" (workflow "+visible(id, false)+" has "+strconv.Itoa(pg.Total)+" steps, numbered from 0).")
		return
	}
	data := &workflowPage{base: d.newBase(w, r, "Workflow "+visible(id, false), ""), St: pg,
		First: pg.Offset + 1, Last: pg.Offset + len(pg.Steps), PageSteps: WorkflowPageSteps}
	data.Cut = pg.Next != 0 && len(pg.Steps) < WorkflowPageSteps
	if pg.Next != 0 {
		data.NextLink = d.link("/workflow", "id", id, "offset", strconv.Itoa(pg.Next))
	}
	if pg.Offset > 0 {
		data.PrevLink = d.link("/workflow", "id", id, "offset", strconv.Itoa(max(pg.Offset-WorkflowPageSteps, 0)))
	}
	running := false
	for _, s := range pg.Steps {
		row := workflowStep{StepStatus: s, JobLink: d.link("/job", "id", s.JobID)}
		row.Deps = s.DependsOn[:min(len(s.DependsOn), MaxDepsShown)]
		row.MoreDeps = len(s.DependsOn) - len(row.Deps)
		data.Steps = append(data.Steps, row)
		running = running || s.State == "waiting" || s.State == "enqueued"
	}
	if pg.Whole() {
		st := ap.WorkflowStatus{Steps: pg.Steps}
		data.State = "running"
		switch {
		case st.Succeeded():
			data.State = "succeeded"
		case st.Done():
			data.State = "ended, not every step succeeded"
		}
	}
	data.Refresh = running
	d.render(w, r, "workflow.html", http.StatusOK, data)
}
