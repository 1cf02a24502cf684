package conformance

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
)

// scaleEnv names the environment variable that stretches the suite's
// timings for a slow or shared machine: a number, 1 by default, that
// multiplies Options.Lease, Options.Wait and the suite's own short delays.
const scaleEnv = ScaleEnv

// ScaleEnv names the variable that stretches the suite's timings (see
// scaleEnv): the mutation runs set it for a survivor's retries.
const ScaleEnv = "ASYNCPLATFORM_CONFORMANCE_SCALE"

// timeScale reads scaleEnv.
func timeScale() (float64, error) {
	v := os.Getenv(scaleEnv)
	if v == "" {
		return 1, nil
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) || f < 1 || f > 100 {
		return 0, fmt.Errorf("%s=%q: want a number from 1 to 100", scaleEnv, v)
	}
	return f, nil
}

func scaled(d time.Duration, f float64) time.Duration { return time.Duration(float64(d) * f) }

// stallWatch notices when this test process does not run: a goroutine that
// sleeps a few milliseconds at a time records every wake-up that came late.
// On a loaded machine such stalls, not the backend, are what lets a lease
// lapse while its handler runs (the platform renews a lease when a third of
// it is spent, so a stall of half a lease can cost it). The cases that
// depend on a renewal arriving in time ask the watch what it saw, and say
// so when they fail.
//
// It keeps the most recent stalls, and apart from them the most recent long
// ones (longStall and over): on a loaded machine short stalls come many a
// second, and the long one a case asks about must not be pushed out by
// them before the case asks.
type stallWatch struct {
	mu     sync.Mutex
	users  int
	stop   chan struct{}
	stalls []stall // the most recent, oldest first
	long   []stall // the most recent of at least longStall, oldest first
}

type stall struct {
	end time.Time     // when the process ran again
	d   time.Duration // how late it was
}

const (
	stallTick = 5 * time.Millisecond
	stallMin  = 20 * time.Millisecond // a wake-up later than this is a stall
	stallKeep = 256
	longStall = 50 * time.Millisecond // kept apart from the short ones, stallKeep of them too
)

var stalls stallWatch

// start starts watching, once for any number of callers; the func it returns
// ends this caller's interest, and the watch stops with the last one.
func (w *stallWatch) start() (done func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.users++
	if w.users == 1 {
		w.stop = make(chan struct{})
		go w.watch(w.stop)
	}
	return func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.users--; w.users == 0 {
			close(w.stop)
		}
	}
}

func (w *stallWatch) watch(stop <-chan struct{}) {
	timer := time.NewTimer(stallTick)
	defer timer.Stop()
	last := time.Now()
	for {
		select {
		case <-stop:
			return
		case <-timer.C:
		}
		now := time.Now()
		if late := now.Sub(last) - stallTick; late >= stallMin {
			w.record(stall{end: now, d: late})
		}
		last = now
		timer.Reset(stallTick)
	}
}

// record keeps s, a stall that has just ended.
func (w *stallWatch) record(s stall) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stalls = keep(w.stalls, s)
	if s.d >= longStall {
		w.long = keep(w.long, s)
	}
}

// keep appends s to ss and drops the oldest beyond stallKeep.
func keep(ss []stall, s stall) []stall {
	ss = append(ss, s)
	if len(ss) > stallKeep {
		ss = ss[len(ss)-stallKeep:]
	}
	return ss
}

// longest returns the longest stall that ended after since.
func (w *stallWatch) longest(since time.Time) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	var d time.Duration
	for _, ss := range [][]stall{w.stalls, w.long} {
		for i := len(ss) - 1; i >= 0 && ss[i].end.After(since); i-- {
			d = max(d, ss[i].d)
		}
	}
	return d
}

// The load factor stretches the bounds on how soon something must happen
// (a due message handed out, a lapsed lease's message back, a woken
// Receive, a cancelled handler's context ended, a retry's backoff), never
// the leases and delays a case sets up: a loaded machine slows brokers and
// workers alike, and a bound that holds on an idle machine fails there
// with nothing wrong. It is the machine's load average over the last
// minute per CPU, from 1 to maxLoadFactor, read when the bound is checked
// (Linux's /proc/loadavg; 1 elsewhere). LoadEnv=1 pins it to 1, as the
// mutation runs do: their bounds must stay where the mutations fail them.
const maxLoadFactor = 2.5

// LoadEnv names the variable that pins the suite's load factor to 1 when
// set to "1": every bound on how soon something must happen is then the
// contract's own, whatever the machine's load.
const LoadEnv = "ASYNCPLATFORM_CONFORMANCE_LOAD"

// loadFactor returns the load factor now.
func loadFactor() float64 {
	if os.Getenv(LoadEnv) == "1" {
		return 1
	}
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 1
	}
	f, _, _ := strings.Cut(string(b), " ")
	avg, err := strconv.ParseFloat(f, 64)
	if err != nil || math.IsNaN(avg) {
		return 1
	}
	return min(max(avg/float64(runtime.NumCPU()), 1), maxLoadFactor)
}
