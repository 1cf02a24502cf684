package faults

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"sort"
	"strings"

	ap "github.com/asyncplatform/asyncplatform"
)

// Report holds the figures of one run, in the vocabulary of RabbitMQ's Jepsen
// checker.
type Report struct {
	Enqueued      int // acknowledged enqueues
	Indeterminate int // enqueues that returned an error (stored or not)
	Completed     int // jobs whose handler committed (returned nil) at least once
	DeadLettered  int // jobs found in the dead-letter queue at the end
	Garbage       int // foreign messages written straight to the queue

	// Lost counts acknowledged enqueues (and garbage messages) that never
	// completed and are not in the dead-letter queue.
	Lost int
	// Duplicated counts jobs that completed more than once, or completed
	// and were dead-lettered, or were dead-lettered more than once. The
	// contract is at-least-once: a duplicate is allowed where a fault can
	// explain it.
	Duplicated int
	// Unexpected counts jobs completed or dead-lettered that were never
	// enqueued at all.
	Unexpected int
	// WrongTries counts jobs whose counters were wrong at some point: an
	// attempt not counted, a count not equal to failures + crashes + 1, a
	// failure counted that did not happen, or a scenario's own expectation
	// of the counters not met.
	WrongTries int
	// Empty says whether every queue (work and dead-letter) was empty at
	// the end, after the dead letters were drained.
	Empty bool
	// Leftover describes what was left when Empty is false.
	Leftover string

	// Tolerated, when set, says why WrongTries does not fail the run (a
	// known limitation of the broker, such as acknowledgements lost in a
	// broker SIGKILL).
	Tolerated string

	// Notes explain every non-zero figure, one line per job (bounded).
	Notes []string

	wrong map[string]bool
}

// String is the one-line summary of the figures.
func (r *Report) String() string {
	empty := "yes"
	if !r.Empty {
		empty = "NO (" + r.Leftover + ")"
	}
	s := fmt.Sprintf("lost=%d duplicated=%d unexpected=%d wrong-tries=%d empty=%s (enqueued=%d indeterminate=%d completed=%d dead=%d garbage=%d)",
		r.Lost, r.Duplicated, r.Unexpected, r.WrongTries, empty, r.Enqueued, r.Indeterminate, r.Completed, r.DeadLettered, r.Garbage)
	if r.Tolerated != "" {
		s += "; wrong try counts tolerated: " + r.Tolerated
	}
	return s
}

const maxNotes = 25

func (r *Report) note(format string, args ...any) {
	if len(r.Notes) < maxNotes {
		r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
	}
}

// Wrong counts a job's counters as wrong (once per job) with why.
func (r *Report) Wrong(id, format string, args ...any) {
	if r.wrong == nil {
		r.wrong = map[string]bool{}
	}
	if !r.wrong[id] {
		r.wrong[id] = true
		r.WrongTries++
	}
	r.note("wrong try count: job %s: %s", id, fmt.Sprintf(format, args...))
}

// Limits are the policy limits a run's jobs were processed under, for
// checking the counters kept in dead letters.
type Limits struct {
	RetryLimit, PoisonLimit int
}

// Check computes the figures of a run from its history, the dead letters
// drained at the end and the garbage written straight to the queue. It sets
// everything but Empty and Leftover.
func Check(h History, dead []ap.DeadLetter, garbage [][]byte, lim Limits) *Report {
	r := &Report{Garbage: len(garbage)}
	enq := h.count(KindEnqueue, "")
	maybe := h.count(KindMaybe, "")
	ok := h.count(KindEnd, ResultOK)
	r.Enqueued = len(enq)
	for id := range maybe {
		if enq[id] == 0 {
			r.Indeterminate++
		}
	}

	deadN := map[string]int{}
	rawN := make([]int, len(garbage))
	for _, dl := range dead {
		if dl.Raw != nil {
			i := matchGarbage(garbage, rawN, dl.Raw)
			if i < 0 {
				r.Unexpected++
				r.note("unexpected: a foreign dead letter (%s) matching no garbage written: %.40q", dl.Reason, dl.Raw)
				continue
			}
			rawN[i]++
			if dl.Reason != ap.ReasonInvalid {
				r.Wrong(dl.Job.ID, "garbage dead-lettered with reason %s, want invalid", dl.Reason)
			}
			continue
		}
		deadN[dl.Job.ID]++
		checkDeadCounts(r, dl, lim)
	}
	for i, n := range rawN {
		switch {
		case n == 0:
			r.Lost++
			r.note("lost: garbage message %d (%.40q) is not in the dead-letter queue", i, garbage[i])
		case n > 1:
			r.Duplicated++
			r.note("duplicated: garbage message %d dead-lettered %d times", i, n)
		}
	}

	ids := map[string]bool{}
	for _, m := range []map[string]int{enq, ok, deadN} {
		for id := range m {
			ids[id] = true
		}
	}
	for _, id := range sortedKeys(ids) {
		done, d := ok[id], deadN[id]
		if done > 0 {
			r.Completed++
		}
		if d > 0 {
			r.DeadLettered++
		}
		switch {
		case enq[id] == 0 && maybe[id] == 0:
			r.Unexpected++
			r.note("unexpected: job %s completed %d times and dead-lettered %d times, never enqueued", id, done, d)
			continue
		case enq[id] > 0 && done == 0 && d == 0:
			r.Lost++
			r.note("lost: job %s: %s", id, h.of(id).brief())
		case done+d > 1:
			r.Duplicated++
			r.note("duplicated: job %s completed %d times, dead-lettered %d times: %s", id, done, d, h.of(id).brief())
		}
		checkStarts(r, id, h.of(id), maybe[id] > 0)
	}
	return r
}

// checkStarts checks the counters a job's handler saw, attempt by attempt.
// An indeterminate enqueue may have stored the job twice (a client's retry
// of a write that had succeeded), and two copies each start at zero: for
// such a job (copies true) equal counters are not counted as wrong.
func checkStarts(r *Report, id string, h History, copies bool) {
	var starts []Event
	fails := 0
	endOf := map[int]string{}  // index in starts -> how that attempt ended
	open := map[string][]int{} // attempt key -> indexes in starts of its running attempts, oldest first
	for _, e := range h {
		switch e.Kind {
		case KindStart:
			if e.Try != e.Failures+e.Crashes+1 {
				r.Wrong(id, "attempt by %s saw TryCount %d with %d failures and %d crashes", e.Worker, e.Try, e.Failures, e.Crashes)
			}
			if e.Failures > fails {
				r.Wrong(id, "attempt by %s saw %d failures, only %d attempts failed before it", e.Worker, e.Failures, fails)
			}
			for i, s := range starts {
				if copies {
					break
				}
				if s.Failures == e.Failures && s.Crashes == e.Crashes && endOf[i] != ResultReject && endOf[i] != ResultCancel {
					r.Wrong(id, "attempt by %s saw the counters (%d failures, %d crashes) of an earlier attempt by %s that ended %q: that attempt was not counted",
						e.Worker, e.Failures, e.Crashes, s.Worker, or(endOf[i], "with no outcome"))
					break
				}
			}
			open[attemptKey(e)] = append(open[attemptKey(e)], len(starts))
			starts = append(starts, e)
		case KindEnd:
			if q := open[attemptKey(e)]; len(q) > 0 {
				endOf[q[0]] = e.Result
				open[attemptKey(e)] = q[1:]
			}
			if e.Result == ResultFail {
				fails++
			}
		case KindAck:
			if e.Result == string(ap.OutcomeHandedBack) {
				for i, s := range starts { // handed back at shutdown: uncounted
					if attemptKey(s) == attemptKey(e) && (endOf[i] == "" || endOf[i] == ResultCancel) {
						endOf[i] = ResultCancel
						break
					}
				}
			}
		}
	}
}

// attemptKey pairs an attempt's end with its start: both carry the worker
// and the counters the handler saw.
func attemptKey(e Event) string {
	return fmt.Sprintf("%s/%d/%d/%d", e.Worker, e.Try, e.Failures, e.Crashes)
}

// checkDeadCounts checks the counters kept in a dead letter.
func checkDeadCounts(r *Report, dl ap.DeadLetter, lim Limits) {
	j := dl.Job
	if j.Policy.RetryLimit != nil {
		lim.RetryLimit = *j.Policy.RetryLimit
	}
	if j.Policy.PoisonLimit != nil {
		lim.PoisonLimit = *j.Policy.PoisonLimit
	}
	if j.TryCount != j.Failures+j.Crashes {
		r.Wrong(j.ID, "dead letter (%s) has TryCount %d with %d failures and %d crashes", dl.Reason, j.TryCount, j.Failures, j.Crashes)
	}
	switch dl.Reason {
	case ap.ReasonRetriesExceeded:
		if j.Failures != lim.RetryLimit+1 {
			r.Wrong(j.ID, "dead-lettered %s with %d failures, the retry limit is %d", dl.Reason, j.Failures, lim.RetryLimit)
		}
	case ap.ReasonPoisoned:
		if j.Crashes <= lim.PoisonLimit {
			r.Wrong(j.ID, "dead-lettered %s with %d crashes, the poison limit is %d", dl.Reason, j.Crashes, lim.PoisonLimit)
		}
	}
}

// matchGarbage returns the index of the garbage message raw is, preferring
// one not matched yet (the same bytes may have been written several times),
// or -1.
func matchGarbage(garbage [][]byte, matched []int, raw []byte) int {
	found := -1
	for i, g := range garbage {
		if bytes.Equal(g, raw) || string(raw) == base64.StdEncoding.EncodeToString(g) {
			if matched[i] == 0 {
				return i
			}
			if found < 0 {
				found = i
			}
		}
	}
	return found
}

// brief describes a job's history in one line.
func (h History) brief() string {
	var b strings.Builder
	for i, e := range h {
		if i == 12 {
			b.WriteString(" …")
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		switch e.Kind {
		case KindStart:
			fmt.Fprintf(&b, "start(%s try=%d f=%d c=%d)", e.Worker, e.Try, e.Failures, e.Crashes)
		case KindEnd, KindDead, KindAck:
			fmt.Fprintf(&b, "%s(%s %s)", e.Kind, e.Worker, e.Result)
		default:
			fmt.Fprintf(&b, "%s", e.Kind)
		}
	}
	if len(h) == 0 {
		return "no events"
	}
	return b.String()
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
