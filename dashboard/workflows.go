package dashboard

import (
	"errors"
	"net/http"

	ap "github.com/asyncplatform/asyncplatform"
)

// workflowPage is the data of workflow.html.
type workflowPage struct {
	base
	St    ap.WorkflowStatus
	State string // running, succeeded, or ended with a step not succeeded
	Steps []workflowStep
}

// workflowStep is one row of workflow.html.
type workflowStep struct {
	ap.StepStatus
	JobLink string // the step's job page (its status, on a queue that tracks it)
}

// workflowPage shows a workflow (or a batch with a callback) by its ID
// (id): its name, whether it was cancelled, and each step's state,
// dead-letter reason, attempt, dependencies, result size and job. Every
// string comes from the store and is escaped by the template.
func (d *Dashboard) workflowPage(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("id")
	if id == "" {
		d.fail(w, r, http.StatusBadRequest, "Give a workflow ID (id=…).")
		return
	}
	st, err := d.p.WorkflowStatus(r.Context(), id)
	if errors.Is(err, ap.ErrWorkflowNotFound) {
		d.fail(w, r, http.StatusNotFound, "No workflow "+visible(id, false)+": unknown, or past its retention.")
		return
	}
	if err != nil {
		d.fail(w, r, http.StatusBadGateway, "Reading the workflow: "+err.Error())
		return
	}
	data := &workflowPage{base: d.newBase(w, r, "Workflow "+visible(id, false), ""), St: st, State: "running"}
	switch {
	case st.Succeeded():
		data.State = "succeeded"
	case st.Done():
		data.State = "ended, not every step succeeded"
	}
	data.Refresh = !st.Done()
	for _, s := range st.Steps {
		data.Steps = append(data.Steps, workflowStep{StepStatus: s, JobLink: d.link("/job", "id", s.JobID)})
	}
	d.render(w, r, "workflow.html", http.StatusOK, data)
}
