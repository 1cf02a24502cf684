package faults

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
)

// Kind is the kind of an Event.
type Kind string

// The kinds of events a history holds.
const (
	// KindEnqueue: Enqueue of the job returned nil (an acknowledged enqueue).
	KindEnqueue Kind = "enqueue"
	// KindMaybe: Enqueue of the job returned an error; it may or may not
	// have been stored (an indeterminate enqueue).
	KindMaybe Kind = "maybe"
	// KindStart: a handler started an attempt of the job.
	KindStart Kind = "start"
	// KindEnd: a handler is about to return; Result says how.
	KindEnd Kind = "end"
	// KindDead: the OnDeadLetter hook saw the job dead-lettered.
	KindDead Kind = "dead"
	// KindAck: the AfterAttempt hook reported an outcome.
	KindAck Kind = "outcome"
	// KindRestart: the broker was down from From to At (a restart or an
	// outage); ID is empty.
	KindRestart Kind = "restart"
	// KindLost: a live worker's platform warned that a lease was lost (a
	// renewal refused or too late, a settle or hand-back refused); ID is
	// empty, as the warning names no job. An attempt whose lease was lost
	// is also a KindAck with OutcomeLeaseLost.
	KindLost Kind = "lost"
	// KindHeld: a dead-letter caller holds the job's dead letter (Try is
	// the record's TryCount): NextDeadLetter handed it out and its callback
	// has not returned.
	KindHeld Kind = "held"
)

// The results of a KindEnd event. A handler writes the event just before it
// returns, so ResultOK is the commit point of the job's work: it is what
// "completed" means in a Report.
const (
	ResultOK     = "ok"     // returned nil
	ResultFail   = "fail"   // returned an error (a counted failure)
	ResultReject = "reject" // returned Reject (uncounted)
	ResultCancel = "cancel" // its context ended (shutdown, lease lost)
)

// Event is one line of a history.
type Event struct {
	Kind     Kind      `json:"k"`
	ID       string    `json:"id"`
	Worker   string    `json:"w,omitempty"`
	Try      int       `json:"try,omitempty"`
	Failures int       `json:"f,omitempty"`
	Crashes  int       `json:"c,omitempty"`
	Copy     uint64    `json:"cp,omitempty"`  // Job.Copy: which copy of the job was handled
	Result   string    `json:"r,omitempty"`   // KindEnd: a Result*; KindDead: the reason; KindAck: the outcome
	From     time.Time `json:"from,omitzero"` // KindEnqueue, KindMaybe, KindRestart: when the call or the outage began
	At       time.Time `json:"at"`
}

// Log appends events to a file, one JSON line per write(2), so that a
// process killed with SIGKILL loses none it had written. Several processes
// each write a file of their own in one directory; LoadHistory merges them.
type Log struct {
	mu   sync.Mutex
	f    *os.File
	dead atomic.Bool // an in-process crash: drop everything from now on
}

// OpenLog opens (creating or appending to) the log file at path.
func OpenLog(path string) (*Log, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	return &Log{f: f}, nil
}

// Add appends e, stamping its time.
func (l *Log) Add(e Event) {
	if l.dead.Load() {
		return
	}
	e.At = time.Now()
	b, err := json.Marshal(e)
	if err != nil {
		panic(err) // an Event always marshals
	}
	b = append(b, '\n')
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, err := l.f.Write(b); err != nil {
		fmt.Fprintf(os.Stderr, "faults: writing the history: %v\n", err)
	}
}

// crash makes the log drop every later event, as a killed process would.
func (l *Log) crash() { l.dead.Store(true) }

// Close closes the file.
func (l *Log) Close() error { return l.f.Close() }

// History is every event of a run, in time order.
type History []Event

// LoadHistory reads and merges every *.jsonl log in dir. A torn last line
// (a writer killed mid-write) is skipped.
func LoadHistory(dir string) (History, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.jsonl"))
	if err != nil {
		return nil, err
	}
	var h History
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			var e Event
			if json.Unmarshal(sc.Bytes(), &e) == nil {
				h = append(h, e)
			}
		}
		err = errors.Join(sc.Err(), f.Close())
		if err != nil {
			return nil, err
		}
	}
	sort.SliceStable(h, func(i, j int) bool { return h[i].At.Before(h[j].At) })
	return h, nil
}

// count returns how many events of kind k (and result r, when not empty)
// the history holds per job ID.
func (h History) count(k Kind, r string) map[string]int {
	n := map[string]int{}
	for _, e := range h {
		if e.Kind == k && (r == "" || e.Result == r) {
			n[e.ID]++
		}
	}
	return n
}

// lostLeases returns the leases live workers reported lost: per job, those
// an attempt reported (OutcomeLeaseLost), and how many more were only
// warned of (a delivery that lost its lease while it waited for a worker
// or for a suspect's isolation, a hand-back refused), which name no job.
func (h History) lostLeases() (byJob map[string]int, unnamed int) {
	byJob = h.count(KindAck, string(ap.OutcomeLeaseLost))
	warned := 0
	for _, e := range h {
		if e.Kind == KindLost {
			warned++
		}
	}
	unnamed = warned
	for _, n := range byJob {
		unnamed -= n
	}
	return byJob, max(unnamed, 0)
}

// restarts returns the broker's restarts and outages, as KindRestart events.
func (h History) restarts() History {
	var out History
	for _, e := range h {
		if e.Kind == KindRestart {
			out = append(out, e)
		}
	}
	return out
}

// acrossRestart reports whether an acknowledged enqueue of e's job was
// under way while the broker restarted: a client that sent it again
// (its connection reset, its confirm lost) may have stored it twice.
func acrossRestart(job, restarts History) bool {
	for _, e := range job {
		if e.Kind != KindEnqueue || e.From.IsZero() {
			continue
		}
		for _, r := range restarts {
			if !e.From.After(r.At) && !r.From.After(e.At) {
				return true
			}
		}
	}
	return false
}

// of returns the events of one job.
func (h History) of(id string) History {
	var out History
	for _, e := range h {
		if e.ID == id {
			out = append(out, e)
		}
	}
	return out
}
