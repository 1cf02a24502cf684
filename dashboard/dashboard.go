package dashboard

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/driver"
)

// The actions Config.Authorize is asked about.
const (
	ActionView    = "view"    // every GET: pages, the static files, a payload download
	ActionPop     = "pop"     // remove the oldest dead letter, showing it
	ActionRedrive = "redrive" // redrive one dead letter, or every one matching a filter
	ActionDelete  = "delete"  // delete one dead letter, or every one matching a filter
	ActionPurge   = "purge"   // delete every dead letter of a queue
	ActionEnqueue = "enqueue" // enqueue a job
	ActionPause   = "pause"   // pause a queue, or one group of its jobs
	ActionResume  = "resume"  // resume a queue, or one of its paused groups (moving its held jobs back)
)

// Defaults of Config.
const (
	DefaultTitle     = "asyncplatform"
	DefaultPageSize  = 50
	MaxPageSize      = 500
	DefaultScanLimit = 100_000
	DefaultScanTime  = 3 * time.Second
	// DefaultLookupLimit is one page of Platform.DeadLetters: about 4 MB
	// read per look-up of 4 KB records.
	DefaultLookupLimit = 1000
	DefaultMaxBody     = 8 << 20
)

// Deleter deletes dead letters by record ID. Every driver.Backend is one:
// give Config.Deleter the backend the platform runs on.
type Deleter interface {
	DeleteDead(ctx context.Context, queue string, ids []string) (int, error)
}

var _ Deleter = driver.Backend(nil)

// Config configures a Dashboard. The zero value is usable.
type Config struct {
	// Prefix is the path the dashboard is mounted at, such as "/jobs": the
	// dashboard strips it from every request and puts it in front of every
	// link. Mount the dashboard on Prefix+"/" in the host's mux. Defaults to
	// "" (mounted at the root).
	Prefix string

	// Queues are queues the queue list shows besides every queue the
	// backend holds (Platform.Queues): a queue not created yet, say. With a
	// backend that cannot list its queues, the list shows these alone. Any
	// other valid queue can still be opened by name. Defaults to none (and
	// to {asyncplatform.DefaultQueue} when the backend cannot list).
	Queues []string

	// ReadOnly refuses every action (pop, redrive, delete, purge, enqueue,
	// pause, resume) with 403, and leaves their forms out of the pages. Defaults to false.
	ReadOnly bool

	// Authorize, when set, is called before every request with the action
	// it asks for (ActionView for every GET, the other Action constants for
	// the POSTs); a non-nil error refuses the request with 403 and the
	// error's text (escaped) in the page. It is where the host checks who
	// is asking. Defaults to nil: every action is allowed to whoever
	// reaches the handler.
	Authorize func(r *http.Request, action string) error

	// CSRFKey signs the CSRF tokens. Give every instance behind one load
	// balancer the same key (at least 16 random bytes). Defaults to 32
	// random bytes made by New: tokens last as long as the process.
	CSRFKey []byte

	// Deleter deletes dead letters by ID, for the "delete" and "delete
	// matching" actions: give it the backend the platform runs on. A
	// deleted record's offloaded payload (with a PayloadStore) is left in
	// the store; pop and purge remove it. Defaults to nil: those two
	// actions are not offered (pop and purge still are).
	Deleter Deleter

	// Recorder counts attempts for the charts; the workers' platform must
	// call its AfterAttempt (Hooks.AfterAttempt). Defaults to nil: the
	// charts show depths only.
	Recorder *Recorder

	// Title is shown in every page's header and title. Defaults to
	// DefaultTitle.
	Title string

	// PageSize is how many dead letters a listing page shows, at most
	// MaxPageSize; a request may ask for fewer or more (n=) up to that.
	// Defaults to DefaultPageSize.
	PageSize int

	// ScanLimit bounds how many dead letters one listing request examines
	// while it looks for matches of a filter; past it, the page shows what
	// it found and a link that continues from where it stopped. Defaults to
	// DefaultScanLimit.
	ScanLimit int

	// ScanTime bounds, likewise, how long one listing request looks, and
	// how long the page of one dead letter looks for it. Defaults to
	// DefaultScanTime.
	ScanTime time.Duration

	// LookupLimit bounds how many dead letters the page of one dead letter
	// (/letter, /raw) examines to find the record its ID names when the
	// record is not where its link's position hint says: it looks through
	// the first LookupLimit records of the queue, and past them answers 404
	// saying how far it looked. A link from a listing page carries the
	// position of its record, so it costs one page of records however deep
	// the record is. Defaults to DefaultLookupLimit.
	LookupLimit int

	// TrustedOrigins are origins ("https://admin.example.com") whose
	// cross-origin POSTs are let through to the CSRF check: for a proxy that
	// rewrites the Host header, say. Defaults to none: a POST whose browser
	// says it came from another origin (Sec-Fetch-Site, or an Origin that
	// is not the Host) is refused before its token is looked at.
	TrustedOrigins []string

	// SecureCookie marks the CSRF cookie Secure even when the request did
	// not come over TLS (behind a proxy that ends TLS). Defaults to false:
	// Secure only for requests that came over TLS.
	SecureCookie bool

	// MaxBody bounds a POST's body, in bytes (an enqueued job's payload
	// included). Defaults to DefaultMaxBody.
	MaxBody int64

	// Logger receives a line for every action taken, with its outcome.
	// Defaults to slog.Default().
	Logger *slog.Logger
}

func (c Config) withDefaults() (Config, error) {
	c.Prefix = strings.TrimRight(c.Prefix, "/")
	if c.CSRFKey == nil {
		c.CSRFKey = make([]byte, 32)
		if _, err := rand.Read(c.CSRFKey); err != nil {
			return c, fmt.Errorf("dashboard: making a CSRF key: %w", err)
		}
	}
	if c.Title == "" {
		c.Title = DefaultTitle
	}
	if c.PageSize == 0 {
		c.PageSize = DefaultPageSize
	}
	if c.ScanLimit == 0 {
		c.ScanLimit = DefaultScanLimit
	}
	if c.ScanTime == 0 {
		c.ScanTime = DefaultScanTime
	}
	if c.LookupLimit == 0 {
		c.LookupLimit = DefaultLookupLimit
	}
	if c.MaxBody == 0 {
		c.MaxBody = DefaultMaxBody
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}

func (c Config) validate() error {
	if c.Prefix != "" && (!strings.HasPrefix(c.Prefix, "/") || strings.ContainsAny(c.Prefix, "?#\"'<> ")) {
		return fmt.Errorf("dashboard: Prefix %q must start with / and be a plain path", c.Prefix)
	}
	for _, q := range c.Queues {
		if err := driver.CheckQueue(q); err != nil {
			return fmt.Errorf("dashboard: Queues: %w", err)
		}
	}
	if len(c.CSRFKey) < 16 {
		return errors.New("dashboard: CSRFKey must be at least 16 bytes")
	}
	if c.PageSize < 1 || c.PageSize > MaxPageSize {
		return fmt.Errorf("dashboard: PageSize %d is outside 1..%d", c.PageSize, MaxPageSize)
	}
	if c.ScanLimit < 1 || c.ScanTime < 0 || c.MaxBody < 1 || c.LookupLimit < 1 {
		return errors.New("dashboard: ScanLimit, ScanTime, LookupLimit and MaxBody must be positive")
	}
	return nil
}

// Dashboard is the dashboard's http.Handler.
type Dashboard struct {
	p       *ap.Platform
	cfg     Config
	mux     *http.ServeMux
	pages   map[string]*template.Template
	cop     *http.CrossOriginProtection
	samples *depthLog
	static  map[string]staticFile
}

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// New returns the dashboard of the platform p.
func New(p *ap.Platform, cfg Config) (*Dashboard, error) {
	if p == nil {
		return nil, errors.New("dashboard: the platform is nil")
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	d := &Dashboard{p: p, cfg: cfg, cop: http.NewCrossOriginProtection(), samples: newDepthLog()}
	for _, o := range cfg.TrustedOrigins {
		if err := d.cop.AddTrustedOrigin(o); err != nil {
			return nil, fmt.Errorf("dashboard: TrustedOrigins: %w", err)
		}
	}
	if err := d.loadStatic(); err != nil {
		return nil, err
	}
	if err := d.parseTemplates(); err != nil {
		return nil, err
	}
	d.cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d.fail(w, r, http.StatusForbidden, "This request came from another site, so it was refused.")
	}))
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", d.view(d.queueList))
	mux.HandleFunc("GET /queue", d.view(d.queuePage))
	mux.HandleFunc("GET /letter", d.view(d.letterPage))
	mux.HandleFunc("GET /jobs", d.view(d.jobsPage))
	mux.HandleFunc("GET /job", d.view(d.jobPage))
	mux.HandleFunc("GET /schedules", d.view(d.schedulesPage))
	mux.HandleFunc("GET /workers", d.view(d.workersPage))
	mux.HandleFunc("GET /history", d.view(d.historyPage))
	mux.HandleFunc("GET /workflow", d.view(d.workflowPage))
	mux.HandleFunc("GET /raw", d.view(d.rawPayload))
	mux.HandleFunc("GET /static/{file}", d.view(d.serveStatic))
	mux.HandleFunc("POST /pop", d.act(ActionPop, d.pop))
	mux.HandleFunc("POST /redrive", d.act(ActionRedrive, d.redrive))
	mux.HandleFunc("POST /delete", d.act(ActionDelete, d.delete))
	mux.HandleFunc("POST /purge", d.act(ActionPurge, d.purge))
	mux.HandleFunc("POST /enqueue", d.act(ActionEnqueue, d.enqueue))
	mux.HandleFunc("POST /pause", d.act(ActionPause, d.pause))
	mux.HandleFunc("POST /resume", d.act(ActionResume, d.resume))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/pop", "/redrive", "/delete", "/purge", "/enqueue", "/pause", "/resume":
			w.Header().Set("Allow", "POST")
			d.fail(w, r, http.StatusMethodNotAllowed, "This address changes things: it takes a POST from the dashboard's own forms.")
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead && r.Method != http.MethodPost {
			w.Header().Set("Allow", "GET, HEAD, POST")
			d.fail(w, r, http.StatusMethodNotAllowed, "Method not allowed.")
			return
		}
		d.fail(w, r, http.StatusNotFound, "No such page.")
	})
	d.mux = mux
	return d, nil
}

// ServeHTTP serves the dashboard.
func (d *Dashboard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	if d.cfg.Prefix != "" {
		path := strings.TrimPrefix(r.URL.Path, d.cfg.Prefix)
		if len(path) == len(r.URL.Path) || (path != "" && path[0] != '/') {
			d.fail(w, r, http.StatusNotFound, "No such page.")
			return
		}
		if path == "" { // the prefix alone: the queue list, at its canonical address
			http.Redirect(w, r, d.cfg.Prefix+"/", http.StatusFound)
			return
		}
		r2 := new(http.Request)
		*r2 = *r
		u := *r.URL
		u.Path = path
		u.RawPath = ""
		r2.URL = &u
		r = r2
	}
	d.mux.ServeHTTP(w, r)
}

// view wraps a GET handler: authorization for ActionView.
func (d *Dashboard) view(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !d.authorized(w, r, ActionView) {
			return
		}
		h(w, r)
	}
}

// act wraps a POST handler: read-only mode, authorization, the
// cross-origin check, then the CSRF token.
func (d *Dashboard) act(action string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if d.cfg.ReadOnly {
			d.fail(w, r, http.StatusForbidden, "This dashboard is read-only: "+action+" is refused.")
			return
		}
		if !d.authorized(w, r, action) {
			return
		}
		if err := d.cop.Check(r); err != nil {
			d.fail(w, r, http.StatusForbidden, "This request came from another site, so it was refused.")
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, d.cfg.MaxBody)
		if err := r.ParseMultipartForm(d.cfg.MaxBody); err != nil && !errors.Is(err, http.ErrNotMultipart) {
			d.fail(w, r, http.StatusBadRequest, "The form could not be read: "+err.Error())
			return
		}
		if !d.validToken(r) {
			d.fail(w, r, http.StatusForbidden, "The form's CSRF token is missing or wrong (reload the page and try again).")
			return
		}
		h(w, r)
	}
}

func (d *Dashboard) authorized(w http.ResponseWriter, r *http.Request, action string) bool {
	if d.cfg.Authorize == nil {
		return true
	}
	if err := d.cfg.Authorize(r, action); err != nil {
		d.fail(w, r, http.StatusForbidden, "Not allowed: "+err.Error())
		return false
	}
	return true
}

// The CSRF token is an HMAC of a random value kept in a cookie: a form must
// carry the token of the cookie the browser sends with it.

const (
	csrfCookie = "asyncplatform_dashboard_csrf"
	csrfField  = "csrf"
)

// csrfToken returns the token for the request's cookie, setting a new
// cookie first when the request has none.
func (d *Dashboard) csrfToken(w http.ResponseWriter, r *http.Request) string {
	if c, err := r.Cookie(csrfCookie); err == nil && validCookieValue(c.Value) {
		return d.sign(c.Value)
	}
	b := make([]byte, 18)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	v := base64.RawURLEncoding.EncodeToString(b)
	http.SetCookie(w, &http.Cookie{
		Name:     csrfCookie,
		Value:    v,
		Path:     d.cfg.Prefix + "/",
		HttpOnly: true,
		Secure:   d.cfg.SecureCookie || r.TLS != nil,
		SameSite: http.SameSiteStrictMode,
	})
	return d.sign(v)
}

func validCookieValue(v string) bool {
	b, err := base64.RawURLEncoding.DecodeString(v)
	return err == nil && len(b) == 18
}

func (d *Dashboard) sign(v string) string {
	m := hmac.New(sha256.New, d.cfg.CSRFKey)
	m.Write([]byte("asyncplatform dashboard csrf\x00"))
	m.Write([]byte(v))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

func (d *Dashboard) validToken(r *http.Request) bool {
	c, err := r.Cookie(csrfCookie)
	if err != nil || !validCookieValue(c.Value) {
		return false
	}
	got := r.PostFormValue(csrfField)
	return got != "" && hmac.Equal([]byte(got), []byte(d.sign(c.Value)))
}

// staticFile is an embedded file with its content type and a version tag
// for its address.
type staticFile struct {
	body  []byte
	ctype string
	tag   string
}

func (d *Dashboard) loadStatic() error {
	d.static = map[string]staticFile{}
	return fs.WalkDir(staticFS, "static", func(path string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		b, err := staticFS.ReadFile(path)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		name := strings.TrimPrefix(path, "static/")
		ctype := "application/octet-stream"
		switch {
		case strings.HasSuffix(name, ".js"):
			ctype = "text/javascript; charset=utf-8"
		case strings.HasSuffix(name, ".css"):
			ctype = "text/css; charset=utf-8"
		case strings.HasSuffix(name, ".svg"):
			ctype = "image/svg+xml"
		}
		d.static[name] = staticFile{body: b, ctype: ctype, tag: base64.RawURLEncoding.EncodeToString(sum[:8])}
		return nil
	})
}

func (d *Dashboard) serveStatic(w http.ResponseWriter, r *http.Request) {
	f, ok := d.static[r.PathValue("file")]
	if !ok {
		d.fail(w, r, http.StatusNotFound, "No such file.")
		return
	}
	w.Header().Set("Content-Type", f.ctype)
	if r.URL.Query().Get("v") == f.tag {
		w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")
	} else {
		w.Header().Set("Cache-Control", "no-cache")
	}
	_, _ = w.Write(f.body)
}

// staticURL is the address of an embedded file, with its version.
func (d *Dashboard) staticURL(name string) string {
	return d.cfg.Prefix + "/static/" + name + "?v=" + d.static[name].tag
}

// queues returns the queues of the queue list with their depths: every
// queue the backend holds (Platform.Queues), then those of Config.Queues it
// does not list. With a backend that cannot list its queues, the error
// matches errors.ErrUnsupported and the queues are Config.Queues (or
// "default"); with another error, they are those too.
func (d *Dashboard) queues(ctx context.Context) ([]ap.QueueInfo, error) {
	infos, err := d.p.Queues(ctx)
	listed := map[string]bool{}
	for _, qi := range infos {
		listed[qi.Name] = true
	}
	extra := d.cfg.Queues
	if err != nil && len(extra) == 0 {
		extra = []string{ap.DefaultQueue}
	}
	for _, q := range extra {
		if listed[q] {
			continue
		}
		qi := ap.QueueInfo{Name: q}
		qi.QueueStats, qi.Err = d.p.Stats(ctx, q)
		if qi.Err == nil && qi.Dead > 0 {
			if page, perr := d.p.DeadLetters(ctx, q, "", 1); perr == nil && len(page.Letters) > 0 {
				qi.OldestDead = page.Letters[0].DeadAt
			}
		}
		infos = append(infos, qi)
	}
	return infos, err
}
