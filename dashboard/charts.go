package dashboard

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
)

// The charts cover Buckets intervals of BucketWidth: the last ten minutes.
const (
	BucketWidth = 10 * time.Second
	Buckets     = 60
)

// bucketOf numbers the interval t falls in.
func bucketOf(t time.Time) int64 { return t.UnixNano() / int64(BucketWidth) }

// Recorder counts attempts per queue and interval, for the charts. Give its
// AfterAttempt to the platform that runs the handlers (Hooks.AfterAttempt)
// and the Recorder to Config.Recorder; a standalone dashboard (another
// process than the workers) sees depths only.
//
//	rec := dashboard.NewRecorder()
//	p, _ := asyncplatform.New(b, asyncplatform.Config{Hooks: asyncplatform.Hooks{AfterAttempt: rec.AfterAttempt}})
//	d, _ := dashboard.New(p, dashboard.Config{Recorder: rec})
//
// It keeps Buckets intervals per queue and is safe for concurrent use.
type Recorder struct {
	mu     sync.Mutex
	queues map[string]*[Buckets]attemptBucket
	now    func() time.Time
}

type attemptBucket struct {
	n         int64 // bucket number
	succeeded int64
	failed    int64 // retried or dead-lettered after the handler ran
	dead      int64 // dead-lettered, whatever the reason
	other     int64 // rejected, handed back, lease lost
}

// NewRecorder returns an empty Recorder.
func NewRecorder() *Recorder {
	return &Recorder{queues: map[string]*[Buckets]attemptBucket{}, now: time.Now}
}

// maxRecordedQueues bounds the queues a Recorder keeps: queue names come
// from jobs, and a platform works the queues of its own Config.
const maxRecordedQueues = 1000

// AfterAttempt counts one attempt; it has the signature of
// asyncplatform.Hooks.AfterAttempt.
func (rec *Recorder) AfterAttempt(_ context.Context, a ap.Attempt) {
	if a.Job == nil {
		return
	}
	n := bucketOf(rec.now())
	rec.mu.Lock()
	defer rec.mu.Unlock()
	ring := rec.queues[a.Job.Queue]
	if ring == nil {
		if len(rec.queues) >= maxRecordedQueues {
			return
		}
		ring = new([Buckets]attemptBucket)
		rec.queues[a.Job.Queue] = ring
	}
	b := &ring[n%Buckets]
	if b.n != n {
		*b = attemptBucket{n: n}
	}
	switch a.Outcome {
	case ap.OutcomeSucceeded:
		b.succeeded++
	case ap.OutcomeRetried:
		b.failed++
	case ap.OutcomeDeadLettered:
		b.failed++
		b.dead++
	default:
		b.other++
	}
}

// window returns the queue's buckets, oldest first, ending with the
// current one; missing intervals are zero.
func (rec *Recorder) window(queue string) []attemptBucket {
	now := bucketOf(rec.now())
	out := make([]attemptBucket, Buckets)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	ring := rec.queues[queue]
	for i := range out {
		n := now - int64(Buckets-1-i)
		out[i].n = n
		if ring != nil && ring[n%Buckets].n == n {
			out[i] = ring[n%Buckets]
		}
	}
	return out
}

// depthLog keeps the depths read by page views, the last one of each
// interval, per queue.
type depthLog struct {
	mu     sync.Mutex
	queues map[string]*[Buckets]depthSample
}

type depthSample struct {
	n int64
	s ap.QueueStats
}

func newDepthLog() *depthLog { return &depthLog{queues: map[string]*[Buckets]depthSample{}} }

func (l *depthLog) add(queue string, s ap.QueueStats, t time.Time) {
	n := bucketOf(t)
	l.mu.Lock()
	defer l.mu.Unlock()
	ring := l.queues[queue]
	if ring == nil {
		if len(l.queues) >= maxRecordedQueues {
			return
		}
		ring = new([Buckets]depthSample)
		l.queues[queue] = ring
	}
	ring[n%Buckets] = depthSample{n: n, s: s}
}

// window returns the samples of the last Buckets intervals, oldest first;
// ok is false where there is none.
func (l *depthLog) window(queue string, now time.Time) (samples []ap.QueueStats, ok []bool) {
	cur := bucketOf(now)
	samples = make([]ap.QueueStats, Buckets)
	ok = make([]bool, Buckets)
	l.mu.Lock()
	defer l.mu.Unlock()
	ring := l.queues[queue]
	if ring == nil {
		return samples, ok
	}
	for i := range samples {
		n := cur - int64(Buckets-1-i)
		if ring[n%Buckets].n == n {
			samples[i], ok[i] = ring[n%Buckets].s, true
		}
	}
	return samples, ok
}

// chart is a small SVG chart: bars (Series[0] drawn under Series[1]) or a
// line, in a W×H box. Every number in it is computed here; nothing from a
// record reaches it.
type chart struct {
	W, H   int
	Label  string // what it shows, for the title and the caption
	Bars   []bar
	Lines  []line
	Max    string // the top of the scale, as text
	Sum    string // a summary: "1,204 ok, 3 failed (0.2 %)"
	Empty  bool   // no data at all: the caption says so
	Note   string // why it is empty
	Alerts bool   // the summary shows failures
}

type bar struct {
	X, Y, W, H string
	Class      string
	Title      string
}

type line struct {
	Points string
	Class  string
}

func ftoa(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) }

// attemptsChart draws succeeded and failed attempts per interval.
func attemptsChart(rec *Recorder, queue string, w, h int) chart {
	c := chart{W: w, H: h, Label: "attempts per 10 s, last 10 min: succeeded and failed (retried or dead-lettered)"}
	if rec == nil {
		c.Empty, c.Note = true, "attempts are counted where the workers run (Config.Recorder)"
		return c
	}
	win := rec.window(queue)
	var max, ok, failed, dead int64
	for _, b := range win {
		max = maxInt(max, b.succeeded+b.failed)
		ok += b.succeeded
		failed += b.failed
		dead += b.dead
	}
	if max == 0 {
		c.Empty, c.Note = true, "no attempts in the last 10 minutes"
		c.Sum = "0 attempts"
		return c
	}
	bw := float64(w) / Buckets
	for i, b := range win {
		x := float64(i) * bw
		total := b.succeeded + b.failed
		if total == 0 {
			continue
		}
		th := float64(total) / float64(max) * float64(h-2)
		fh := float64(b.failed) / float64(max) * float64(h-2)
		at := time.Unix(0, b.n*int64(BucketWidth)).UTC().Format("15:04:05")
		title := fmt.Sprintf("%s: %d succeeded, %d failed", at, b.succeeded, b.failed)
		c.Bars = append(c.Bars, bar{X: ftoa(x), Y: ftoa(float64(h) - th), W: ftoa(bw * 0.8), H: ftoa(th - fh), Class: "ok", Title: title})
		if b.failed > 0 {
			c.Bars = append(c.Bars, bar{X: ftoa(x), Y: ftoa(float64(h) - fh), W: ftoa(bw * 0.8), H: ftoa(fh), Class: "bad", Title: title})
		}
	}
	c.Max = group(max)
	c.Sum = attemptsSum(ok, failed, dead, recentRate(win, rec.now()))
	c.Alerts = failed > 0
	return c
}

// rateBuckets is how many intervals the attempts rate covers, the current
// one included: the last minute, so that it reads what runs now.
const rateBuckets = 6

// recentRate returns the attempts per second over the last rateBuckets
// intervals of win (oldest first, ending with the current one, which has
// run until now).
func recentRate(win []attemptBucket, now time.Time) float64 {
	var n int64
	for _, b := range win[len(win)-rateBuckets:] {
		n += b.succeeded + b.failed
	}
	elapsed := time.Duration(now.UnixNano() % int64(BucketWidth))
	secs := (time.Duration(rateBuckets-1)*BucketWidth + elapsed).Seconds()
	return float64(n) / secs
}

// attemptsSum is the attempts chart's caption: the attempts that
// succeeded, the failed attempts (those that will be retried and those
// dead-lettered), and the share of the jobs that ended which ended dead
// (dead-lettered over succeeded and dead-lettered: a failed attempt that
// will be retried is no failed job), with the rate of the last minute.
func attemptsSum(ok, failed, dead int64, rate float64) string {
	retried := failed - min(dead, failed)
	ended := ok + dead
	share := 0.0
	if ended > 0 {
		share = float64(dead) / float64(ended) * 100
	}
	return fmt.Sprintf("%s succeeded, %s retried, %s dead-lettered (%.1f %% of the jobs that ended) · %s/s in the last minute",
		group(ok), group(retried), group(dead), share, rateText(rate))
}

// rateText prints a rate with the precision it needs: "0.02", "1.5", "240".
func rateText(r float64) string {
	switch {
	case r == 0:
		return "0"
	case r < 0.1:
		return strconv.FormatFloat(r, 'f', 2, 64)
	case r < 100:
		return strconv.FormatFloat(r, 'f', 1, 64)
	}
	return strconv.FormatFloat(r, 'f', 0, 64)
}

// depthChart draws the waiting jobs (ready + scheduled + in flight) and
// the dead letters as two lines, from the samples page views took.
func depthChart(l *depthLog, queue string, now time.Time, w, h int) chart {
	c := chart{W: w, H: h, Label: "depth, last 10 min: waiting (ready + scheduled + in flight) and dead"}
	samples, ok := l.window(queue, now)
	var max int64
	n := 0
	for i, s := range samples {
		if ok[i] {
			n++
			max = maxInt(max, maxInt(waiting(s), s.Dead))
		}
	}
	if n == 0 {
		c.Empty, c.Note = true, "no samples yet"
		return c
	}
	if max == 0 {
		max = 1
	}
	step := float64(w) / (Buckets - 1)
	y := func(v int64) string { return ftoa(float64(h-1) - float64(maxInt(v, 0))/float64(max)*float64(h-2)) }
	var wait, dead []string
	for i, s := range samples {
		if !ok[i] {
			continue
		}
		x := float64(i) * step
		if n == 1 { // one sample: a short flat segment, so that it shows
			wait = append(wait, ftoa(x-step)+","+y(waiting(s)))
			dead = append(dead, ftoa(x-step)+","+y(s.Dead))
		}
		wait = append(wait, ftoa(x)+","+y(waiting(s)))
		dead = append(dead, ftoa(x)+","+y(s.Dead))
	}
	c.Lines = []line{{Points: strings.Join(wait, " "), Class: "wait"}, {Points: strings.Join(dead, " "), Class: "dead"}}
	c.Max = group(max)
	last := samples[len(samples)-1]
	for i := len(samples) - 1; i >= 0; i-- {
		if ok[i] {
			last = samples[i]
			break
		}
	}
	c.Sum = fmt.Sprintf("%s waiting, %s dead (%d samples)", group(waiting(last)), group(last.Dead), n)
	return c
}

// waiting is the jobs not yet done: ready, scheduled and in flight (a depth
// the backend cannot tell, -1, counts as 0).
func waiting(s ap.QueueStats) int64 {
	return maxInt(s.Ready, 0) + maxInt(s.Scheduled, 0) + maxInt(s.InFlight, 0)
}

func maxInt(a, b int64) int64 {
	if a > b {
		return a
	}
	return b
}

// group writes n with thousands separators: 100,000.
func group(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
