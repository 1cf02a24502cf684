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
	// GarbageExtra counts the dead letters of garbage messages beyond one
	// each (a garbage message dead-lettered twice counts 1 here and 1 in
	// Duplicated).
	GarbageExtra int
	// Unexpected counts jobs completed or dead-lettered that were never
	// enqueued at all.
	Unexpected int
	// Redelivered counts jobs one of whose copies was delivered again after
	// an attempt on it had reached an outcome, with the same counters: the
	// outcome's report was lost in a fault, or the copy was written twice
	// (a write re-sent after a lost confirm). At-least-once; not a wrong
	// try count.
	Redelivered int
	// StoredTwice counts jobs whose acknowledged enqueue was under way
	// while the broker restarted and whose counters are right only if it
	// stored the job twice (each copy counting its own tries); without
	// the restart they would count as wrong tries.
	StoredTwice int
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

	// Notes explain every non-zero figure, one line per job (bounded).
	Notes []string

	wrong map[string]bool
	dups  []string // the jobs counted in Duplicated
}

// String is the one-line summary of the figures.
func (r *Report) String() string {
	empty := "yes"
	if !r.Empty {
		empty = "NO (" + r.Leftover + ")"
	}
	s := fmt.Sprintf("lost=%d duplicated=%d unexpected=%d wrong-tries=%d empty=%s (enqueued=%d indeterminate=%d completed=%d dead=%d garbage=%d redelivered=%d stored-twice=%d)",
		r.Lost, r.Duplicated, r.Unexpected, r.WrongTries, empty, r.Enqueued, r.Indeterminate, r.Completed, r.DeadLettered, r.Garbage, r.Redelivered, r.StoredTwice)
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
	deadOf := map[string][]ap.DeadLetter{}
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
		deadOf[dl.Job.ID] = append(deadOf[dl.Job.ID], dl)
		checkDeadCounts(r, dl, lim)
	}
	for i, n := range rawN {
		switch {
		case n == 0:
			r.Lost++
			r.note("lost: garbage message %d (%.40q) is not in the dead-letter queue", i, garbage[i])
		case n > 1:
			r.Duplicated++
			r.GarbageExtra += n - 1
			r.note("duplicated: garbage message %d dead-lettered %d times", i, n)
		}
	}

	restarts := h.restarts()
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
			r.dups = append(r.dups, id)
			r.note("duplicated: job %s completed %d times, dead-lettered %d times: %s", id, done, d, explainDup(h.of(id), deadOf[id], maybe[id] > 0))
		}
		// An enqueue that failed, or that was under way while the broker
		// restarted, may have stored the job twice.
		across := maybe[id] == 0 && acrossRestart(h.of(id), restarts)
		if across {
			strict := &Report{}
			checkStarts(strict, id, h.of(id), false)
			if strict.WrongTries > 0 {
				r.StoredTwice++
				r.note("stored twice? job %s: its enqueue was under way during a broker restart, and its counters are right only if it was stored twice: %s", id, h.of(id).brief())
			}
		}
		checkStarts(r, id, h.of(id), maybe[id] > 0 || across)
	}
	return r
}

// explainDup says what a job was done more than once as (each commit and
// dead letter, with its copy), and why at-least-once allowed it.
func explainDup(h History, dead []ap.DeadLetter, indeterminate bool) string {
	type end struct {
		what     string
		copy     uint64
		counters string // "" for a dead letter: its counters include the last attempt
	}
	var ends []end
	for _, e := range h {
		if e.Kind == KindEnd && e.Result == ResultOK {
			ends = append(ends, end{"completed by " + e.Worker, e.Copy, fmt.Sprintf("%d/%d", e.Failures, e.Crashes)})
		}
	}
	for _, dl := range dead {
		ends = append(ends, end{"dead-lettered " + string(dl.Reason), dl.Job.CopyNumber(), ""})
	}
	var parts []string
	for _, x := range ends {
		p := fmt.Sprintf("%s on copy %d", x.what, x.copy)
		if x.counters != "" {
			p += " (failures/crashes " + x.counters + ")"
		}
		parts = append(parts, p)
	}
	why := "an older copy came back after a newer one was written (the new copy is written before the old one is acknowledged, and that acknowledgement was lost)"
	switch {
	case indeterminate:
		why = "its enqueue was indeterminate: it may have been stored twice"
	default:
	pairs:
		for i, a := range ends {
			for _, b := range ends[i+1:] {
				switch {
				case a.copy == b.copy && a.counters != "" && a.counters == b.counters:
					why = fmt.Sprintf("copy %d was delivered twice with the same counters (the first outcome's report was lost in the fault, or the copy was written twice)", a.copy)
					break pairs
				case a.copy == b.copy:
					why = fmt.Sprintf("copy %d came back after its outcome was lost (the worker died or its connection was cut after the commit), the lost attempt counted as a crash", a.copy)
				}
			}
		}
	}
	return strings.Join(parts, "; ") + ": " + why
}

// attempt is one handler call of a job as the history shows it: its start,
// how the handler ended and what the platform reported.
type attempt struct {
	Event          // the start
	end     string // the handler's Result*; "" when it never returned (its worker died)
	outcome string // the AfterAttempt outcome; "" when none was recorded
}

// reported says whether the attempt reached an outcome that the platform
// tried to report: the handler returned (nil, an error or Reject), or it was
// cancelled by a shutdown and handed back. The report may have been lost in
// the fault (OutcomeLeaseLost), so the same copy can come back with the same
// counters: a duplicate delivery. An attempt whose handler never returned
// (its worker died) or was cancelled because the lease was lost reached no
// outcome: it is a crash, and every later delivery must count it.
func (a *attempt) reported() bool {
	switch a.end {
	case ResultOK, ResultFail, ResultReject:
		return true
	case ResultCancel:
		return a.outcome == string(ap.OutcomeHandedBack)
	}
	return false
}

// checkStarts checks the counters a job's handler saw, attempt by attempt.
//
// An attempt that shows the counters (failures, crashes) of an earlier one
// is, by copy (Job.Copy):
//   - on the same copy: a duplicate delivery (at-least-once: the earlier
//     attempt's report was lost, or the copy was written twice) when the
//     earlier attempt reached an outcome the platform tried to report; a
//     wrong try count (an uncounted crash) when it reached none;
//   - on a newer copy: wrong when the earlier attempt was a counted
//     failure (the retry it wrote carries one more failure). After a
//     Reject or a hand-back (they write the next copy uncounted) or a
//     success (a copy newer than a succeeded one was written uncounted by a
//     second delivery of it: a hand-back before the handler ran leaves no
//     event) it is allowed. A crash writes no copy: it is judged on its own
//     copy, whose next delivery must count it; a newer copy may have been
//     written before the crash (a Reject whose ack was lost, then the old
//     copy crashed once and the new copy crashed once too: equal counters,
//     both right);
//   - on an older copy: allowed (the older copy came back after a delivery
//     of it wrote the newer one uncounted); its own deliveries are judged
//     by the same-copy rule.
//
// Each attempt is judged by how it ended in the end, not at the time the
// later one started: under a broker that forgot a delivery the two can run
// at once. An indeterminate enqueue may have stored the job twice (a
// client's retry of a write that had succeeded), and each stored copy
// starts at zero with copy number 0: for such a job (copies true) equal
// counters are not counted as wrong.
func checkStarts(r *Report, id string, h History, copies bool) {
	var atts []*attempt
	fails := 0
	open := map[string][]*attempt{} // attempt key -> attempts with no end yet, oldest first
	unreported := map[string][]*attempt{}
	for _, e := range h {
		switch e.Kind {
		case KindStart:
			if e.Try != e.Failures+e.Crashes+1 {
				r.Wrong(id, "attempt by %s saw TryCount %d with %d failures and %d crashes", e.Worker, e.Try, e.Failures, e.Crashes)
			}
			if e.Failures > fails {
				r.Wrong(id, "attempt by %s saw %d failures, only %d attempts failed before it", e.Worker, e.Failures, fails)
			}
			a := &attempt{Event: e}
			atts = append(atts, a)
			k := attemptKey(e)
			open[k] = append(open[k], a)
			unreported[k] = append(unreported[k], a)
		case KindEnd:
			k := attemptKey(e)
			if q := open[k]; len(q) > 0 {
				q[0].end = e.Result
				open[k] = q[1:]
			}
			if e.Result == ResultFail {
				fails++
			}
		case KindAck:
			k := attemptKey(e)
			if q := unreported[k]; len(q) > 0 {
				q[0].outcome = e.Result
				unreported[k] = q[1:]
				if q[0].end == "" && e.Result == string(ap.OutcomeHandedBack) {
					q[0].end = ResultCancel // handed back at shutdown: uncounted
				}
			}
		}
	}
	if copies {
		return
	}
	redelivered := false
	for n, e := range atts {
		for _, s := range atts[:n] {
			if s.Failures != e.Failures || s.Crashes != e.Crashes {
				continue
			}
			switch {
			case s.Copy == e.Copy && !s.reported():
				r.Wrong(id, "attempt by %s on copy %d saw the counters (%d failures, %d crashes) of an earlier attempt on that copy by %s that ended %s: that crash was not counted",
					e.Worker, e.Copy, e.Failures, e.Crashes, s.Worker, s.how())
			case s.Copy == e.Copy:
				if !redelivered {
					redelivered = true
					r.Redelivered++
					r.note("duplicate delivery: job %s: copy %d delivered again to %s with the counters (%d failures, %d crashes) of an attempt by %s that ended %s",
						id, e.Copy, e.Worker, e.Failures, e.Crashes, s.Worker, s.how())
				}
				continue
			case e.Copy > s.Copy && s.end == ResultFail:
				r.Wrong(id, "attempt by %s on copy %d saw the counters (%d failures, %d crashes) of an attempt on copy %d by %s that ended %s: that attempt was not counted",
					e.Worker, e.Copy, e.Failures, e.Crashes, s.Copy, s.Worker, s.how())
			default:
				continue
			}
			break
		}
	}
}

// how says how an attempt ended, for a note.
func (a *attempt) how() string {
	s := or(a.end, "with no outcome")
	if a.outcome != "" {
		s += " (" + a.outcome + ")"
	}
	return s
}

// attemptKey pairs an attempt's end and outcome with its start: all carry
// the worker, the copy and the counters the handler saw.
func attemptKey(e Event) string {
	return fmt.Sprintf("%s/%d/%d/%d/%d", e.Worker, e.Copy, e.Try, e.Failures, e.Crashes)
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

func sortedKeys[V any](m map[string]V) []string {
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
