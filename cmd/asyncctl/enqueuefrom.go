package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
)

// check validates the flags every job of an enqueue shares, and returns
// the --header flags as headers (nil when none).
func (e enqueueOpts) check() (map[string]string, error) {
	if e.delay < 0 || e.deadline < 0 || e.retryLimit < -1 || e.poisonLimit < -1 {
		return nil, usageErrorf("--delay and --deadline must not be negative, --retry-limit and --poison-limit must be -1 or more")
	}
	var headers map[string]string
	for _, h := range e.headers {
		k, v, ok := strings.Cut(h, "=")
		if !ok || k == "" {
			return nil, usageErrorf("--header %q is not KEY=VALUE", h)
		}
		if headers == nil {
			headers = map[string]string{}
		}
		headers[k] = v
	}
	return headers, nil
}

// apply sets the job's delay, deadline and limits from the flags.
func (e enqueueOpts) apply(job *ap.Job, now time.Time) {
	if e.delay > 0 {
		job.NotBefore = now.Add(e.delay)
	}
	if e.deadline > 0 {
		job.Deadline = now.Add(e.delay + e.deadline)
	}
	if e.retryLimit >= 0 {
		job.Policy.RetryLimit = ap.Limit(e.retryLimit)
	}
	if e.poisonLimit >= 0 {
		job.Policy.PoisonLimit = ap.Limit(e.poisonLimit)
	}
}

// jobLine is one line of an enqueue --from file: the fields of deadJSON
// that make a job.
type jobLine struct {
	ID          string            `json:"id"`
	Type        string            `json:"type"`
	Queue       string            `json:"queue"`
	Headers     map[string]string `json:"headers"`
	Payload     []byte            `json:"payload"`
	PayloadText *string           `json:"payload_text"`
}

// maxLine bounds one line of a --from file: a 32 MiB payload in base64,
// and room for the rest.
const maxLine = 48 << 20

// enqueueFrom enqueues the job of every line of e.from, one at a time.
func (c *cli) enqueueFrom(ctx context.Context, e enqueueOpts) error {
	switch {
	case e.payloadSet || e.file != "" || e.id != "":
		return usageErrorf("--from takes the payloads and IDs from its lines: give no --payload, --file or --id")
	case e.skip < 0:
		return usageErrorf("--skip must be 0 or more")
	}
	if e.queue != "" {
		if err := checkQueue("--queue: ", e.queue); err != nil {
			return err
		}
	}
	headers, err := e.check()
	if err != nil {
		return err
	}
	var r io.Reader = c.stdin
	name := "stdin"
	total := int64(-1)
	if e.from != "-" {
		f, err := os.Open(e.from)
		if err != nil {
			return fmt.Errorf("reading the jobs: %w", err)
		}
		defer f.Close()
		lines, err := countLines(f)
		if err != nil {
			return fmt.Errorf("reading the jobs: %w", err)
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return fmt.Errorf("reading the jobs: %w", err)
		}
		r, name, total = f, e.from, max(0, lines-int64(e.skip))
	}
	p, closeFn, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer closeFn()

	in := c.interruptible(ctx)
	prog := c.progress(total, "enqueuing")
	defer prog.done()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	line, n := 0, 0
	stopAt := func(err error) error {
		if err == nil {
			return nil
		}
		prog.done()
		more := ""
		if line > 1 {
			more = fmt.Sprintf("; --skip %d goes on from line %d", line-1, line)
		}
		return fmt.Errorf("%s line %d: %w (%d jobs of the lines before it were enqueued%s)", name, line, err, n, more)
	}
	for sc.Scan() {
		line++
		text := bytes.TrimSpace(sc.Bytes())
		if line <= e.skip || len(text) == 0 {
			continue
		}
		if in.stop() {
			prog.done()
			c.enqueued(e, n, line-1, true)
			return interrupted("enqueued %d jobs, up to line %d of %s; --skip %d goes on from there", n, line-1, name, line-1)
		}
		var l jobLine
		if err := json.Unmarshal(text, &l); err != nil {
			return &exitErr{exitUsage, stopAt(fmt.Errorf("not a JSON object of a job: %w", err))}
		}
		job := &ap.Job{ID: l.ID, Type: l.Type, Queue: l.Queue, Headers: l.Headers, Payload: l.Payload}
		if e.newIDs {
			job.ID = ""
		}
		if job.Type == "" {
			job.Type = e.typ
		}
		if job.Queue == "" {
			job.Queue = e.queue
		}
		if job.Payload == nil && l.PayloadText != nil {
			job.Payload = []byte(*l.PayloadText)
		}
		for k, v := range headers {
			if job.Headers == nil {
				job.Headers = map[string]string{}
			}
			job.Headers[k] = v
		}
		e.apply(job, time.Now())
		if job.Type == "" {
			return &exitErr{exitUsage, stopAt(errors.New("no type: give it in the line or with --type"))}
		}
		if err := p.Enqueue(in.work, job); err != nil {
			if errors.Is(err, ap.ErrInvalidJob) || errors.Is(err, ap.ErrPayloadTooLarge) {
				return &exitErr{exitUsage, stopAt(err)}
			}
			return stopAt(err)
		}
		n++
		prog.add(1)
	}
	if err := sc.Err(); err != nil {
		line++
		return stopAt(fmt.Errorf("reading the jobs: %w", err))
	}
	prog.done()
	return c.enqueued(e, n, line, false)
}

// enqueued prints what enqueue --from did.
func (c *cli) enqueued(e enqueueOpts, n, lines int, stopped bool) error {
	if c.json {
		return writeJSON(c.stdout, struct {
			Enqueued    int  `json:"enqueued"`
			Lines       int  `json:"lines"`
			Interrupted bool `json:"interrupted,omitempty"`
		}{n, lines, stopped})
	}
	fmt.Fprintf(c.stdout, "enqueued %d jobs from %d lines\n", n, max(0, lines-e.skip))
	return nil
}

// countLines counts the lines of r that are not blank.
func countLines(r io.Reader) (int64, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	var n int64
	for sc.Scan() {
		if len(bytes.TrimSpace(sc.Bytes())) > 0 {
			n++
		}
	}
	return n, sc.Err()
}
