package dashboard

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
)

// maxGroupsShown bounds the paused groups a queue's page lists, each with
// the depth of its held queues (one Stats call each: the queue's, and its
// priority levels' that the backend lists).
const maxGroupsShown = 100

// resumeGroupTime bounds a group's resume, which goes on when the browser
// leaves: stopped half-way, it would leave held jobs of a group no longer
// paused.
const resumeGroupTime = 10 * time.Minute

// noStoreText says why a backend cannot pause.
const noStoreText = "Pausing needs the backend's store, and this backend has none (RabbitMQ needs a companion store)."

// groupRow is a paused group on a queue's page.
type groupRow struct {
	Name string
	Held int64 // jobs on its held queue; -1 when unknown
}

// pauseState is what a queue's page shows of its pauses: the queue's own
// state is in its Stats.
type pauseState struct {
	NoStore    bool // the backend cannot pause
	Groups     []groupRow
	MoreGroups int // paused groups beyond maxGroupsShown
	GroupsErr  string
}

// readPauses reads a queue's paused groups and how many jobs each holds.
func (d *Dashboard) readPauses(ctx context.Context, q string) pauseState {
	var ps pauseState
	groups, err := d.p.PausedGroups(ctx, q)
	switch {
	case errors.Is(err, ap.ErrNoStore):
		ps.NoStore = true
		return ps
	case err != nil:
		ps.GroupsErr = "Reading the paused groups failed: " + err.Error()
		return ps
	}
	if len(groups) > maxGroupsShown {
		ps.MoreGroups = len(groups) - maxGroupsShown
		groups = groups[:maxGroupsShown]
	}
	var names []string // the backend's queues: a level's held queue is read only when listed
	if len(groups) > 0 {
		names, _ = d.p.QueueNames(ctx)
	}
	for _, g := range groups {
		row := groupRow{Name: g, Held: -1}
		// A name a writer to the store made up may make no valid queue
		// name: its held count is unknown.
		if s, err := d.p.Stats(ctx, ap.HeldQueue(q, g)); err == nil && s.Ready >= 0 {
			row.Held = s.Ready + max(s.Scheduled, 0) + max(s.InFlight, 0)
			for l := 1; l <= ap.MaxPriority; l++ {
				held := ap.HeldQueue(ap.PriorityQueue(q, l), g)
				if _, ok := slices.BinarySearch(names, held); !ok {
					continue
				}
				if s, err := d.p.Stats(ctx, held); err == nil {
					row.Held += max(s.Ready, 0) + max(s.Scheduled, 0) + max(s.InFlight, 0)
				}
			}
		}
		ps.Groups = append(ps.Groups, row)
	}
	return ps
}

// pause pauses the queue, or the group named in the form.
func (d *Dashboard) pause(w http.ResponseWriter, r *http.Request) {
	q, ok := d.queueName(w, r)
	if !ok {
		return
	}
	f, _ := parseFilter(r.PostForm, time.Now())
	grp := strings.TrimSpace(r.PostForm.Get("group"))
	var err error
	if grp == "" {
		err = d.p.Pause(r.Context(), q)
	} else {
		err = d.p.PauseGroup(r.Context(), q, grp)
	}
	d.logAction(r, ActionPause, q, 0, err, "group", grp)
	switch {
	case errors.Is(err, ap.ErrNoStore):
		d.backToQueue(w, r, q, f, false, "Nothing was paused. "+noStoreText)
	case err != nil:
		d.backToQueue(w, r, q, f, false, "Nothing was paused: "+err.Error())
	case grp == "":
		d.backToQueue(w, r, q, f, true, "Paused queue "+q+": within about a second every worker stops taking its jobs and hands back those it took ahead; "+
			"running jobs finish. Its jobs wait, and none spends a try.")
	default:
		d.backToQueue(w, r, q, f, true, "Paused group "+visible(grp, false)+" of queue "+q+": workers set its jobs aside as they come "+
			"(held on queue "+visible(ap.HeldQueue(q, grp), false)+"); the queue's other jobs keep flowing.")
	}
}

// resume resumes the queue, or the group named in the form, moving the
// group's held jobs back.
func (d *Dashboard) resume(w http.ResponseWriter, r *http.Request) {
	q, ok := d.queueName(w, r)
	if !ok {
		return
	}
	f, _ := parseFilter(r.PostForm, time.Now())
	grp := strings.TrimSpace(r.PostForm.Get("group"))
	if grp == "" {
		err := d.p.Resume(r.Context(), q)
		d.logAction(r, ActionResume, q, 0, err)
		switch {
		case errors.Is(err, ap.ErrNoStore):
			d.backToQueue(w, r, q, f, false, "Nothing was resumed. "+noStoreText)
		case err != nil:
			d.backToQueue(w, r, q, f, false, "Nothing was resumed: "+err.Error())
		default:
			d.backToQueue(w, r, q, f, true, "Resumed queue "+q+": within about a second the workers take its jobs again.")
		}
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), resumeGroupTime)
	defer cancel()
	n, err := d.p.ResumeGroup(ctx, q, grp)
	d.logAction(r, ActionResume, q, n, err, "group", grp)
	name := visible(grp, false)
	switch {
	case errors.Is(err, ap.ErrNoStore):
		d.backToQueue(w, r, q, f, false, "Nothing was resumed. "+noStoreText)
	case err != nil:
		d.backToQueue(w, r, q, f, false, fmt.Sprintf("Resuming group %s of queue %s: moved %s held jobs back, then: %v. "+
			"Jobs not moved stay held: resume the group again.", name, q, group(int64(n)), err))
	default:
		d.backToQueue(w, r, q, f, true, fmt.Sprintf("Resumed group %s of queue %s: moved %s held job%s back to the queue.", name, q, group(int64(n)), plural(n)))
	}
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
