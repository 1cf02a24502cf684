package dashboard

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
)

// Every action answers with a redirect to the queue's page (the filter kept)
// and a flash saying what was done, or with a page of its own: pop shows
// what it popped, an action on a filter asks first.

func (d *Dashboard) backToQueue(w http.ResponseWriter, r *http.Request, q string, f filter, ok bool, msg string) {
	d.setFlash(w, r, ok, msg)
	http.Redirect(w, r, d.link("/queue", "q", q, f.values()), http.StatusSeeOther)
}

func (d *Dashboard) logAction(r *http.Request, action, queue string, n int, err error, attrs ...any) {
	attrs = append([]any{"action", action, "queue", queue, "count", n, "remote", r.RemoteAddr}, attrs...)
	if err != nil {
		d.cfg.Logger.WarnContext(r.Context(), "dashboard: action failed", append(attrs, "error", err)...)
		return
	}
	d.cfg.Logger.InfoContext(r.Context(), "dashboard: action", attrs...)
}

func (d *Dashboard) pop(w http.ResponseWriter, r *http.Request) {
	q, ok := d.queueName(w, r)
	if !ok {
		return
	}
	var popped ap.DeadLetter
	err := d.p.NextDeadLetter(r.Context(), q, func(_ context.Context, dl ap.DeadLetter) (bool, error) {
		popped = dl
		return true, nil
	})
	d.logAction(r, ActionPop, q, 1, err, "id", popped.ID)
	f, _ := parseFilter(r.PostForm, time.Now())
	switch {
	case errors.Is(err, ap.ErrNoDeadLetters):
		d.backToQueue(w, r, q, f, false, "Queue "+q+" has no dead letter to pop (or every one is held by another caller).")
		return
	case err != nil:
		d.backToQueue(w, r, q, f, false, "Popping failed: "+err.Error())
		return
	}
	data := d.letterData(w, r, q, popped, "", f)
	data.Popped = true
	data.Title = "Popped " + visible(popped.ID, false)
	d.render(w, r, "letter.html", http.StatusOK, data)
}

// confirmPage asks before an action on every record matching a filter.
type confirmPage struct {
	base
	Action    string // redrive or delete
	Verb      string
	Count     int
	Raw       int // records among them that are not jobs (redrive leaves them)
	Described string
	Hidden    url.Values
	Back      string
}

// matching returns the IDs of every record matching f, and how many of
// them are not jobs.
func (d *Dashboard) matching(ctx context.Context, q string, f filter) (ids []string, raw int, err error) {
	_, err = scan(ctx, d.p, q, f, position{}, -1, -1, time.Time{}, func(fd found) bool {
		ids = append(ids, fd.DL.ID)
		if fd.DL.Raw != nil {
			raw++
		}
		return true
	})
	return ids, raw, err
}

func (d *Dashboard) redrive(w http.ResponseWriter, r *http.Request) {
	d.onRecords(w, r, ActionRedrive)
}

func (d *Dashboard) delete(w http.ResponseWriter, r *http.Request) {
	if d.cfg.Deleter == nil {
		d.fail(w, r, http.StatusForbidden, "Deleting single dead letters needs Config.Deleter (pop and purge do not).")
		return
	}
	d.onRecords(w, r, ActionDelete)
}

// onRecords redrives or deletes one record (id=) or every record matching
// the filter in the form (match=1), after a confirmation (confirm=yes).
func (d *Dashboard) onRecords(w http.ResponseWriter, r *http.Request, action string) {
	q, ok := d.queueName(w, r)
	if !ok {
		return
	}
	ctx := r.Context()
	f, err := parseFilter(r.PostForm, time.Now())
	if err != nil {
		d.fail(w, r, http.StatusBadRequest, "Bad filter: "+err.Error())
		return
	}
	verb := map[string]string{ActionRedrive: "Redrove", ActionDelete: "Deleted"}[action]
	if id := r.PostForm.Get("id"); id != "" {
		n, err := d.apply(ctx, action, q, []string{id})
		d.logAction(r, action, q, n, err, "id", id)
		if err != nil {
			d.backToQueue(w, r, q, f, false, fmt.Sprintf("%s %d of 1 dead letter, then: %v", verb, n, err))
			return
		}
		if n == 0 {
			d.backToQueue(w, r, q, f, false, "Dead letter "+visible(id, false)+" was not "+strings.ToLower(verb)+
				": it is gone, held by another caller, or (to redrive) not a job.")
			return
		}
		d.backToQueue(w, r, q, f, true, verb+" dead letter "+visible(id, false)+".")
		return
	}
	if r.PostForm.Get("match") != "1" {
		d.fail(w, r, http.StatusBadRequest, "Say which dead letters: an id, or match=1 with a filter.")
		return
	}
	if action == ActionDelete && !f.set() {
		d.fail(w, r, http.StatusBadRequest, "Deleting every dead letter is a purge: use the purge form, which asks for the queue's name.")
		return
	}
	ids, raw, err := d.matching(ctx, q, f)
	if err != nil {
		d.fail(w, r, http.StatusBadGateway, "Reading the dead letters: "+err.Error())
		return
	}
	if r.PostForm.Get("confirm") != "yes" {
		hidden := f.values()
		hidden.Set("asof", fmt.Sprint(f.AsOf)) // the ages the count was made with
		data := &confirmPage{base: d.newBase(w, r, "Confirm", q), Action: action, Verb: strings.TrimSuffix(strings.ToLower(verb), "d"),
			Count: len(ids), Raw: raw, Described: f.describe(), Hidden: hidden, Back: d.link("/queue", "q", q, f.values())}
		if action == ActionRedrive {
			data.Verb = "redrive"
		} else {
			data.Verb = "delete"
		}
		d.render(w, r, "confirm.html", http.StatusOK, data)
		return
	}
	var n int
	switch {
	case len(ids) == 0:
	case action == ActionRedrive && !f.set():
		n, err = d.p.Redrive(ctx, q) // all: one pass, no list of ids
	default:
		n, err = d.apply(ctx, action, q, ids)
	}
	d.logAction(r, action, q, n, err, "filter", f.describe())
	if err != nil {
		d.backToQueue(w, r, q, f, false, fmt.Sprintf("%s %d of %d dead letters matching %s, then: %v", verb, n, len(ids), f.describe(), err))
		return
	}
	msg := fmt.Sprintf("%s %s of %s dead letters matching %s.", verb, group(int64(n)), group(int64(len(ids))), f.describe())
	if n < len(ids) {
		msg += " The others were gone, held by another caller, or (to redrive) not jobs."
	}
	d.backToQueue(w, r, q, f, true, msg)
}

// apply redrives or deletes the records, a thousand at a time.
func (d *Dashboard) apply(ctx context.Context, action, q string, ids []string) (int, error) {
	if action == ActionRedrive {
		return d.p.Redrive(ctx, q, ids...)
	}
	done := 0
	for len(ids) > 0 {
		chunk := ids[:min(len(ids), maxBatch)]
		ids = ids[len(chunk):]
		n, err := d.cfg.Deleter.DeleteDead(ctx, q, chunk)
		done += n
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

func (d *Dashboard) purge(w http.ResponseWriter, r *http.Request) {
	q, ok := d.queueName(w, r)
	if !ok {
		return
	}
	f, _ := parseFilter(r.PostForm, time.Now())
	if r.PostForm.Get("confirm") != q {
		d.backToQueue(w, r, q, f, false, "Nothing was purged: type the queue's name ("+q+") to confirm.")
		return
	}
	n, err := d.p.PurgeDeadLetters(r.Context(), q)
	d.logAction(r, ActionPurge, q, n, err)
	if err != nil {
		d.backToQueue(w, r, q, f, false, fmt.Sprintf("Purged %d dead letters, then: %v", n, err))
		return
	}
	d.backToQueue(w, r, q, f, true, fmt.Sprintf("Purged %s dead letters of queue %s.", group(int64(n)), q))
}

func (d *Dashboard) enqueue(w http.ResponseWriter, r *http.Request) {
	q, ok := d.queueName(w, r)
	if !ok {
		return
	}
	f, _ := parseFilter(r.PostForm, time.Now())
	job := &ap.Job{
		ID:      strings.TrimSpace(r.PostForm.Get("job_id")),
		Type:    strings.TrimSpace(r.PostForm.Get("type")),
		Queue:   q,
		Payload: []byte(strings.ReplaceAll(r.PostForm.Get("payload"), "\r\n", "\n")),
	}
	headers, err := parseHeaders(r.PostForm.Get("headers"))
	if err == nil {
		job.Headers = headers
		var delay time.Duration
		if delay, err = parseAge(strings.TrimSpace(r.PostForm.Get("delay"))); err == nil && delay > 0 {
			job.NotBefore = time.Now().Add(delay)
		}
	}
	if err == nil {
		err = d.p.Enqueue(r.Context(), job)
	}
	d.logAction(r, ActionEnqueue, q, 1, err, "id", job.ID, "type", job.Type)
	if err != nil {
		d.backToQueue(w, r, q, f, false, "Nothing was enqueued: "+err.Error())
		return
	}
	d.backToQueue(w, r, q, f, true, "Enqueued job "+job.ID+" of type "+visible(job.Type, false)+" to queue "+q+".")
}

// parseHeaders reads "key: value" lines; blank lines are skipped.
func parseHeaders(s string) (map[string]string, error) {
	var h map[string]string
	for _, ln := range strings.Split(strings.ReplaceAll(s, "\r\n", "\n"), "\n") {
		if strings.TrimSpace(ln) == "" {
			continue
		}
		k, v, ok := strings.Cut(ln, ":")
		if !ok || strings.TrimSpace(k) == "" {
			return nil, fmt.Errorf("header line %q is not key: value", ln)
		}
		if h == nil {
			h = map[string]string{}
		}
		h[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	return h, nil
}
