package dashboard

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/driver"
)

// base is what every page's layout reads.
type base struct {
	AppTitle  string
	Title     string
	Prefix    string
	CSRF      string
	Nonce     string
	Script    string
	Style     string
	ReadOnly  bool
	CanDelete bool
	Flash     *flash
	Queue     string // the queue the page is about, for the header's link
	Refresh   bool   // the page may refresh itself
}

func (b *base) page() *base { return b }

type pageData interface{ page() *base }

var pageFiles = []string{"queues.html", "queue.html", "letter.html", "jobs.html", "job.html", "schedules.html", "workers.html", "history.html", "workflow.html", "confirm.html", "error.html"}

func (d *Dashboard) parseTemplates() error {
	funcs := template.FuncMap{
		"vis":   func(s any) string { return visible(fmt.Sprint(s), false) },
		"lines": func(s any) string { return visible(fmt.Sprint(s), true) },
		"num": func(n any) string {
			switch n := n.(type) {
			case int:
				return group(int64(n))
			case int64:
				return group(n)
			}
			return fmt.Sprint(n)
		},
		"depth": func(n int64) string {
			if n < 0 {
				return "–"
			}
			return group(n)
		},
		"ts": func(t time.Time) string {
			if t.IsZero() {
				return "–"
			}
			return t.UTC().Format("2006-01-02 15:04:05.000 UTC")
		},
		"ago":         ago,
		"link":        d.link,
		"reasons":     reasonNames,
		"reasonClass": reasonClass,
	}
	d.pages = map[string]*template.Template{}
	for _, name := range pageFiles {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/parts.html", "templates/"+name)
		if err != nil {
			return fmt.Errorf("dashboard: parsing %s: %w", name, err)
		}
		d.pages[name] = t
	}
	return nil
}

// link returns the dashboard address of path with the query given as
// key/value pairs (empty values left out) or as url.Values.
func (d *Dashboard) link(path string, kv ...any) string {
	v := url.Values{}
	for i := 0; i < len(kv); i++ {
		switch x := kv[i].(type) {
		case url.Values:
			for k, vs := range x {
				v[k] = append(v[k], vs...)
			}
		case string:
			if i+1 < len(kv) {
				if s := fmt.Sprint(kv[i+1]); s != "" {
					v.Set(x, s)
				}
				i++
			}
		}
	}
	u := d.cfg.Prefix + path
	if len(v) > 0 {
		u += "?" + v.Encode()
	}
	return u
}

// reasonNames returns ap.Reasons as strings, for the reason filter.
func reasonNames() []string {
	rs := ap.Reasons()
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = string(r)
	}
	return out
}

// reasonClass returns the CSS class of a record's reason: one of a fixed
// list, "reason-other" for a reason it does not know (a record's reason is
// whatever its writer wrote).
func reasonClass(reason string) string {
	if slices.Contains(reasonNames(), reason) {
		return "reason-" + reason
	}
	return "reason-other"
}

// ago says how long ago t was, roughly: "3 s", "5 min", "2 h", "4 d".
func ago(t time.Time) string {
	if t.IsZero() {
		return "–"
	}
	d := time.Since(t)
	switch {
	case d < 0:
		return "in the future"
	case d < time.Minute:
		return fmt.Sprintf("%d s ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%d min ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%d h ago", int(d.Hours()))
	default:
		return fmt.Sprintf("%d d ago", int(d.Hours()/24))
	}
}

// readyWait says how long the oldest ready job of s has waited at now:
// "–" when none is ready, "unknown" when the backend cannot tell.
func readyWait(s ap.QueueStats, now time.Time) string {
	age, ok := s.ReadyAge(now)
	switch {
	case !ok:
		return "unknown"
	case s.Ready == 0 && s.OldestReady.IsZero():
		return "–"
	case age < time.Minute:
		return fmt.Sprintf("%d s", int(age.Seconds()))
	case age < time.Hour:
		return fmt.Sprintf("%d min", int(age.Minutes()))
	case age < 48*time.Hour:
		return fmt.Sprintf("%d h", int(age.Hours()))
	default:
		return fmt.Sprintf("%d d", int(age.Hours()/24))
	}
}

// newBase fills in what every page shows.
func (d *Dashboard) newBase(w http.ResponseWriter, r *http.Request, title, queue string) base {
	return base{
		AppTitle:  d.cfg.Title,
		Title:     title,
		Prefix:    d.cfg.Prefix,
		CSRF:      d.csrfToken(w, r),
		Script:    d.staticURL("app.js"),
		Style:     d.staticURL("app.css"),
		ReadOnly:  d.cfg.ReadOnly,
		CanDelete: d.cfg.Deleter != nil && !d.cfg.ReadOnly,
		Flash:     d.takeFlash(w, r),
		Queue:     queue,
	}
}

// render executes the page into a buffer, then sends it with its
// Content-Security-Policy.
func (d *Dashboard) render(w http.ResponseWriter, r *http.Request, name string, status int, data pageData) {
	nb := make([]byte, 18)
	_, _ = rand.Read(nb)
	nonce := base64.RawURLEncoding.EncodeToString(nb)
	data.page().Nonce = nonce
	var buf bytes.Buffer
	if err := d.pages[name].Execute(&buf, data); err != nil {
		d.cfg.Logger.ErrorContext(r.Context(), "dashboard: rendering a page", "page", name, "error", err)
		http.Error(w, "the page could not be rendered", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'nonce-"+nonce+"'; style-src 'self'; img-src 'self'; "+
		"form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	if r.Method != http.MethodHead {
		_, _ = w.Write(buf.Bytes())
	}
}

type errorPage struct {
	base
	Status  int
	Message string
	Back    string
}

// fail answers with an error page saying msg (escaped like everything else).
func (d *Dashboard) fail(w http.ResponseWriter, r *http.Request, status int, msg string) {
	data := &errorPage{base: d.newBase(w, r, http.StatusText(status), ""), Status: status, Message: msg, Back: d.link("/")}
	q := r.URL.Query().Get("q")
	if r.PostForm != nil { // parsed: a POST that got as far as its form
		q = r.PostForm.Get("q")
	}
	if driver.CheckQueue(q) == nil {
		data.Queue = q
		data.Back = d.link("/queue", "q", q)
	}
	d.render(w, r, "error.html", status, data)
}

// A flash is the message an action leaves for the page it redirects to,
// in a cookie of its own.
type flash struct {
	OK   bool
	Text string
}

const flashCookie = "asyncplatform_dashboard_flash"

func (d *Dashboard) setFlash(w http.ResponseWriter, r *http.Request, ok bool, text string) {
	if len(text) > 600 {
		text = text[:600] + "…"
	}
	kind := "e"
	if ok {
		kind = "o"
	}
	http.SetCookie(w, &http.Cookie{
		Name: flashCookie, Value: base64.RawURLEncoding.EncodeToString([]byte(kind + text)),
		Path: d.cfg.Prefix + "/", HttpOnly: true, Secure: d.cfg.SecureCookie || r.TLS != nil,
		SameSite: http.SameSiteStrictMode, MaxAge: 60,
	})
}

func (d *Dashboard) takeFlash(w http.ResponseWriter, r *http.Request) *flash {
	c, err := r.Cookie(flashCookie)
	if err != nil {
		return nil
	}
	http.SetCookie(w, &http.Cookie{Name: flashCookie, Path: d.cfg.Prefix + "/", MaxAge: -1, HttpOnly: true,
		Secure: d.cfg.SecureCookie || r.TLS != nil, SameSite: http.SameSiteStrictMode})
	b, err := base64.RawURLEncoding.DecodeString(c.Value)
	if err != nil || len(b) < 1 {
		return nil
	}
	return &flash{OK: b[0] == 'o', Text: string(b[1:])}
}

// ---- the queue list ----

type queueRow struct {
	Name       string
	Link       string
	Stats      ap.QueueStats
	OldestDead time.Time
	ReadyWait  string         // how long the oldest ready job has waited: "–" with none ready, "unknown"
	Groups     []ap.HeldGroup // paused groups, and groups with jobs held still
	Err        string
	Attempts   chart
	Depth      chart
}

type queuesPage struct {
	base
	Rows       []queueRow
	Discovered bool // the backend listed its queues
	ListErr    string
}

func (d *Dashboard) queueList(w http.ResponseWriter, r *http.Request) {
	data := &queuesPage{base: d.newBase(w, r, "Queues", "")}
	data.Refresh = true
	infos, err := d.queues(r.Context())
	switch {
	case err == nil:
		data.Discovered = true
	case errors.Is(err, errors.ErrUnsupported):
	default:
		data.ListErr = "Listing the backend's queues failed, so only the configured ones are shown: " + err.Error()
	}
	now := time.Now()
	for _, qi := range infos {
		row := queueRow{Name: qi.Name, Link: d.link("/queue", "q", qi.Name), Stats: qi.QueueStats, OldestDead: qi.OldestDead, Groups: qi.Groups,
			ReadyWait: readyWait(qi.QueueStats, now)}
		if qi.Err != nil {
			row.Err = qi.Err.Error()
		} else {
			d.samples.add(qi.Name, qi.QueueStats, now)
		}
		row.Attempts = attemptsChart(d.cfg.Recorder, qi.Name, 180, 32)
		row.Depth = depthChart(d.samples, qi.Name, now, 180, 32)
		data.Rows = append(data.Rows, row)
	}
	d.render(w, r, "queues.html", http.StatusOK, data)
}

// ---- a queue and its dead letters ----

type letterRow struct {
	ID, JobID, Type, Reason, Error, Worker string
	DeadAt                                 time.Time
	Tries                                  int
	Raw                                    bool
	Pos                                    int64
	Link                                   string
}

type queuePage struct {
	base
	pauseState
	Stats     ap.QueueStats
	StatsErr  string
	Unknown   bool // the backend holds no such queue (ap.UnknownQueueError)
	Attempts  chart
	Depth     chart
	Filter    filter
	FilterSet bool
	FilterErr string
	Described string
	Hidden    url.Values // the filter, for the forms that act on it
	Rows      []letterRow
	ListErr   string
	First     int64 // 1-based index of the first record shown, unfiltered
	Last      int64
	Scanned   int
	Cut       bool
	Next      string // link to the next page, empty on the last
	FirstLink string // link to the first page, empty on it
	AtStart   bool
	PageSize  int
}

func (d *Dashboard) queueName(w http.ResponseWriter, r *http.Request) (string, bool) {
	q := r.FormValue("q")
	if err := driver.CheckQueue(q); err != nil {
		d.fail(w, r, http.StatusBadRequest, "Not a queue name: "+err.Error())
		return "", false
	}
	return q, true
}

func (d *Dashboard) queuePage(w http.ResponseWriter, r *http.Request) {
	q, ok := d.queueName(w, r)
	if !ok {
		return
	}
	ctx := r.Context()
	data := &queuePage{base: d.newBase(w, r, q, q), PageSize: d.cfg.PageSize}
	data.Refresh = true
	// Before Stats: a backend may list a queue once its depths are read.
	var unknown *ap.UnknownQueueError
	data.Unknown = errors.As(d.p.CheckKnownQueue(ctx, q), &unknown)
	if s, err := d.p.Stats(ctx, q); err != nil {
		data.StatsErr = err.Error()
	} else {
		data.Stats = s
		d.samples.add(q, s, time.Now())
	}
	data.pauseState = d.readPauses(ctx, q)
	data.Attempts = attemptsChart(d.cfg.Recorder, q, 420, 80)
	data.Depth = depthChart(d.samples, q, time.Now(), 420, 80)

	query := r.URL.Query()
	f, err := parseFilter(query, time.Now())
	if err != nil {
		data.FilterErr = err.Error()
		f = filter{AsOf: time.Now().Unix()}
	}
	data.Filter, data.FilterSet, data.Described, data.Hidden = f, f.set(), f.describe(), f.values()
	if n, err := strconv.Atoi(query.Get("n")); err == nil && n > 0 {
		data.PageSize = min(n, MaxPageSize)
	}
	start, err := decodePosition(query.Get("at"))
	if err != nil {
		d.fail(w, r, http.StatusBadRequest, "That page's cursor is not one this dashboard made.")
		return
	}
	data.AtStart = start == (position{})
	if !data.AtStart {
		data.FirstLink = d.link("/queue", "q", q, f.values(), "n", nz(query.Get("n")))
	}
	res, err := scan(ctx, d.p, q, f, start, data.PageSize, d.cfg.ScanLimit, time.Now().Add(d.cfg.ScanTime), nil)
	if err != nil {
		data.ListErr = err.Error()
	}
	back := f.values()
	for _, fd := range res.Found {
		dl := fd.DL
		data.Rows = append(data.Rows, letterRow{
			ID: dl.ID, JobID: dl.Job.ID, Type: dl.Job.Type, Reason: string(dl.Reason), Error: firstLine(dl.Error, 160),
			Worker: dl.Worker, DeadAt: dl.DeadAt, Tries: dl.Job.TryCount, Raw: dl.Raw != nil, Pos: fd.Pos + 1,
			Link: d.link("/letter", "q", q, "id", dl.ID, "at", fd.Page.encode(), back),
		})
	}
	if len(res.Found) > 0 {
		data.First, data.Last = res.Found[0].Pos+1, res.Found[len(res.Found)-1].Pos+1
	}
	data.Scanned, data.Cut = res.Scanned, res.Cut
	if !res.Done && err == nil {
		data.Next = d.link("/queue", "q", q, f.values(), "at", res.Next.encode(), "n", nz(query.Get("n")))
	}
	d.render(w, r, "queue.html", http.StatusOK, data)
}

// nz is s, or "" for what is not a positive number.
func nz(s string) string {
	if n, err := strconv.Atoi(s); err != nil || n <= 0 {
		return ""
	}
	return s
}

// firstLine returns the first line of s, at most n bytes of it.
func firstLine(s string, n int) string {
	s, _, cut := strings.Cut(s, "\n")
	if len(s) > n {
		s = strings.ToValidUTF8(s[:n], "") + "…"
	} else if cut {
		s += " …"
	}
	return s
}

// ---- one dead letter ----

type header struct{ Key, Value string }

type letterPage struct {
	base
	DL       ap.DeadLetter
	Copy     uint64
	Payload  payloadView
	Raw      payloadView
	Headers  []header
	Pos      int64
	Popped   bool
	Back     string
	Views    []viewLink
	Download string
	Hidden   url.Values
	Offload  bool
}

type viewLink struct {
	Name, Label, Link string
	Current           bool
}

func (d *Dashboard) letterPage(w http.ResponseWriter, r *http.Request) {
	q, ok := d.queueName(w, r)
	if !ok {
		return
	}
	query := r.URL.Query()
	id := query.Get("id")
	hint, err := decodePosition(query.Get("at"))
	if err != nil {
		hint = position{}
	}
	fd, err := find(r.Context(), d.p, q, id, hint, d.cfg.LookupLimit, time.Now().Add(d.cfg.ScanTime))
	if errors.Is(err, errNotFound) {
		d.fail(w, r, http.StatusNotFound, "Queue "+q+" has no dead letter "+visible(id, false)+": it may have been popped, redriven or purged.")
		return
	}
	if cut := (*lookupCut)(nil); errors.As(err, &cut) {
		d.fail(w, r, http.StatusNotFound, fmt.Sprintf("Queue %s has no dead letter %s among its first %d dead letters, and the dashboard looks no further for a record named by its ID alone: "+
			"open it from a listing page of the queue, whose link says where it is. It may also have been popped, redriven or purged.", q, visible(id, false), cut.Scanned))
		return
	}
	if err != nil {
		d.fail(w, r, http.StatusBadGateway, "Reading the dead letters: "+err.Error())
		return
	}
	f, _ := parseFilter(query, time.Now())
	data := d.letterData(w, r, q, fd.DL, query.Get("view"), f)
	data.Pos = fd.Pos + 1
	selfQuery := []any{"q", q, "id", id, "at", query.Get("at"), f.values()}
	for _, v := range []struct{ name, label string }{{viewAuto, "auto"}, {viewJSON, "JSON"}, {viewText, "text"}, {viewHex, "hex"}} {
		data.Views = append(data.Views, viewLink{Name: v.name, Label: v.label, Current: query.Get("view") == v.name,
			Link: d.link("/letter", append(slices.Clone(selfQuery), "view", v.name)...)})
	}
	data.Download = d.link("/raw", "q", q, "id", id, "at", query.Get("at"))
	d.render(w, r, "letter.html", http.StatusOK, data)
}

func (d *Dashboard) letterData(w http.ResponseWriter, r *http.Request, q string, dl ap.DeadLetter, view string, f filter) *letterPage {
	data := &letterPage{base: d.newBase(w, r, "Dead letter "+visible(dl.ID, false), q), DL: dl, Copy: dl.Job.CopyNumber()}
	data.Payload = renderPayload(dl.Job.Payload, view)
	if dl.Raw != nil {
		data.Raw = renderPayload(dl.Raw, viewHex)
	}
	data.Offload = dl.PayloadRef != "" && len(dl.Job.Payload) == 0
	for k, v := range dl.Job.Headers {
		data.Headers = append(data.Headers, header{k, v})
	}
	sort.Slice(data.Headers, func(i, j int) bool { return data.Headers[i].Key < data.Headers[j].Key })
	data.Back = d.link("/queue", "q", q, f.values())
	data.Hidden = f.values()
	return data
}

// rawPayload sends a dead letter's payload (or its raw bytes) as a
// download, never as a page.
func (d *Dashboard) rawPayload(w http.ResponseWriter, r *http.Request) {
	q, ok := d.queueName(w, r)
	if !ok {
		return
	}
	query := r.URL.Query()
	hint, _ := decodePosition(query.Get("at"))
	fd, err := find(r.Context(), d.p, q, query.Get("id"), hint, d.cfg.LookupLimit, time.Now().Add(d.cfg.ScanTime))
	if cut := (*lookupCut)(nil); errors.Is(err, errNotFound) || errors.As(err, &cut) {
		d.fail(w, r, http.StatusNotFound, "No such dead letter.")
		return
	}
	if err != nil {
		d.fail(w, r, http.StatusBadGateway, "Reading the dead letters: "+err.Error())
		return
	}
	b := fd.DL.Job.Payload
	if fd.DL.Raw != nil {
		b = fd.DL.Raw
	}
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Disposition", `attachment; filename="dead-letter.bin"`)
	h.Set("Content-Security-Policy", "default-src 'none'; sandbox")
	h.Set("Cache-Control", "no-store")
	_, _ = w.Write(b)
}
