package asyncplatform

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/payload"
	"github.com/asyncplatform/asyncplatform/internal/redrive"
	"github.com/asyncplatform/asyncplatform/internal/runner"
	"github.com/asyncplatform/asyncplatform/internal/wire"
)

// Reason says why a job was dead-lettered.
type Reason string

// The dead-letter reasons of the behaviour contract.
const (
	// ReasonRetriesExceeded: the handler failed more often than the retry
	// limit allows.
	ReasonRetriesExceeded Reason = "retries_exceeded"
	// ReasonInvalid: the handler returned Invalid, or the message on the
	// queue was not a job at all (DeadLetter.Raw then holds its bytes).
	ReasonInvalid Reason = "invalid"
	// ReasonPermanent: the handler returned Permanent.
	ReasonPermanent Reason = "permanent"
	// ReasonPoisoned: the job's crashes passed its poison limit; its handler
	// was not called for the last delivery.
	ReasonPoisoned Reason = "poisoned"
	// ReasonUnhandled: no handler was registered for the job's type after
	// Config.UnhandledRetries requeues.
	ReasonUnhandled Reason = "unhandled"
	// ReasonExpired: the job's Deadline passed before it could run.
	ReasonExpired Reason = "expired"
	// ReasonPayloadMissing: the job's offloaded payload was gone at
	// delivery.
	ReasonPayloadMissing Reason = "payload_missing"
)

// Reasons returns every dead-letter reason the platform writes, in the
// order of the README's outcome table: the one list that tools (asyncctl's
// --reason and its completion, the dashboard's filter) offer and check
// against. A record's Reason is whatever its writer wrote, so a tool shows
// one it does not know as it is.
func Reasons() []Reason {
	return []Reason{
		ReasonRetriesExceeded, ReasonInvalid, ReasonPermanent, ReasonPoisoned,
		ReasonUnhandled, ReasonExpired, ReasonPayloadMissing, ReasonCancelled, ReasonDependencyFailed,
	}
}

// DeadLetter is a job that will not be attempted again, with why.
type DeadLetter struct {
	// ID identifies this record (the job's ID, with a copy number when the
	// job was retried or redriven before): a job dead-lettered again after a
	// redrive makes a new record.
	ID string

	// Job is the job as last attempted: ID, type, payload, headers, its
	// counters (TryCount = Failures + Crashes) and its error history.
	Job Job

	// Queue is the queue the job came from.
	Queue string

	// Reason says why it was dead-lettered.
	Reason Reason

	// Error is the text of the last error (with the stack, for a panic).
	Error string

	// DeadAt is when it was dead-lettered.
	DeadAt time.Time

	// Worker names the worker that dead-lettered it (Config.WorkerName).
	Worker string

	// PayloadRef is the PayloadStore reference of an offloaded payload (the
	// store keeps it while the dead letter exists; NextDeadLetter fetches it
	// into Job.Payload, a listing does not).
	PayloadRef string

	// signed: the record was signed (see Config.SigningKey).
	signed bool

	// Raw holds the message's bytes as found when it was not a job at all
	// (Reason is ReasonInvalid); Job is then empty but for its ID, which
	// the platform made up.
	Raw []byte
}

// NextDeadLetter peeks at the oldest dead letter of the queue and calls fn
// with it. When fn returns pop == true and a nil error the record is removed;
// otherwise it stays where it was and the next call sees it again, and fn's
// error is returned. Two concurrent callers never get the same record. With
// no dead letter available it returns ErrNoDeadLetters.
//
// The record stays held while fn runs, however long it takes: the platform
// renews the backend's hold on it until fn returns.
//
// A record that cannot be decoded is still handed to fn, with Reason
// ReasonInvalid, the undecodable bytes in Raw and the decoding error in Error,
// so that it can be popped.
func (p *Platform) NextDeadLetter(ctx context.Context, queue string, fn func(context.Context, DeadLetter) (pop bool, err error)) (err error) {
	if p.backend == nil {
		return ErrNotNew
	}
	if err := validQueue(queue); err != nil {
		return err
	}
	dd, err := p.backend.NextDead(ctx, queue)
	if err != nil {
		if errors.Is(err, driver.ErrNoDeadLetters) {
			return err
		}
		return fmt.Errorf("asyncplatform: next dead letter of queue %q: %w", queue, err)
	}
	pop := false
	var dl DeadLetter
	defer func() {
		// Settle on every path, panics included, with a context that
		// outlives a cancelled ctx: the record must not stay hidden.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		remove := pop && err == nil
		serr := p.backend.SettleDead(sctx, dd, remove)
		switch {
		case serr != nil && err == nil:
			err = fmt.Errorf("asyncplatform: settling dead letter %s of queue %q: %w", dd.ID, queue, serr)
		case serr == nil && remove:
			p.payloads.Drop(sctx, dl.Job.ID, dl.PayloadRef) // nothing points at it any more
		}
	}()
	// The hold is renewed until fn returns: deferred after the settle, the
	// renewals stop before it.
	defer runner.KeepDead(ctx, p.backend, dd, p.caps.DeadHold, p.log)()
	dl = decodeDeadRecord(p.codec, queue, dd.DeadMessage)
	if dl.PayloadRef != "" && p.payloads != nil {
		b, gerr := p.payloads.Get(ctx, dl.Job.ID, dl.PayloadRef)
		switch {
		case gerr == nil:
			dl.Job.Payload = b
		case !errors.Is(gerr, ErrPayloadNotFound): // the record stays; try again later
			return fmt.Errorf("asyncplatform: fetching the offloaded payload of dead letter %s: %w", dd.ID, gerr)
		}
	}
	pop, err = fn(ctx, dl)
	return err
}

func decodeDeadRecord(c wire.Codec, queue string, m driver.DeadMessage) DeadLetter {
	dl := DeadLetter{ID: m.ID, signed: wire.Signed(m.Body)}
	body, err := c.Open(m.Body)
	if err == nil {
		err = decodeDead(body, &dl)
	}
	if err != nil {
		return DeadLetter{
			ID:     m.ID,
			Job:    Job{ID: m.ID, Queue: queue},
			Queue:  queue,
			Reason: ReasonInvalid,
			Error:  "undecodable dead-letter record: " + err.Error(),
			Raw:    append([]byte{}, m.Body...),
		}
	}
	return dl
}

// DeadLetterPage is one page of a dead-letter listing.
type DeadLetterPage struct {
	// Letters are the records of the page, oldest first.
	Letters []DeadLetter
	// Next is the cursor of the next page; empty on the last page.
	Next string
}

// DeadLetters lists the queue's dead letters, oldest first, limit at a time
// (at most 1,000; zero means 100), starting at cursor (empty for the start).
// It leaves the dead-letter queue as it was: order and count.
func (p *Platform) DeadLetters(ctx context.Context, queue, cursor string, limit int) (DeadLetterPage, error) {
	if p.backend == nil {
		return DeadLetterPage{}, ErrNotNew
	}
	if err := validQueue(queue); err != nil {
		return DeadLetterPage{}, err
	}
	switch {
	case limit == 0:
		limit = 100
	case limit < 0 || limit > 1000:
		return DeadLetterPage{}, fmt.Errorf("%w: dead-letter page limit %d is outside 1..1000", ErrInvalidConfig, limit)
	}
	recs, next, err := p.backend.ListDead(ctx, queue, cursor, limit)
	if err != nil {
		return DeadLetterPage{}, fmt.Errorf("asyncplatform: listing dead letters of queue %q: %w", queue, err)
	}
	page := DeadLetterPage{Letters: make([]DeadLetter, len(recs)), Next: next}
	for i, r := range recs {
		page.Letters[i] = decodeDeadRecord(p.codec, queue, r)
	}
	return page, nil
}

// Redrive moves dead letters back to their queue as fresh jobs: the counters
// are reset to 0, the error history is kept, and a Deadline that has passed is
// cleared (the operator asked for the job to run). With no ids it redrives
// every dead letter of the queue; ids are job IDs or record IDs. It returns
// how many jobs it enqueued.
//
// Each job is enqueued before its record is deleted, so a crash in between
// leaves a duplicate, never a loss. A record held by a NextDeadLetter caller at
// that moment stays too (a duplicate, reported in the log). Records that were
// not jobs (Raw) cannot be redriven and stay; ids not found are ignored.
//
// A record that cannot go back stays and the others go on; the error then
// names each one: a unique key a newer job holds (ErrDuplicate), a unique
// claim header the platform could not have written (ErrInvalidJob: forged
// or corrupt, with a window outside 1 ms to driver.MaxTTL, say), a signed
// record on a platform without the key (ErrNoSigningKey), and, with a
// SigningKey, a record whose own (signed) queue is not the queue it was
// read from (ErrInvalidJob: a copy moved there). A job goes back only to
// the queue it was dead-lettered from.
func (p *Platform) Redrive(ctx context.Context, queue string, ids ...string) (int, error) {
	return p.RedriveWith(ctx, queue, RedriveOptions{}, ids...)
}

// RedriveOptions tunes RedriveWith.
type RedriveOptions struct {
	// Chunk is how many records are enqueued, then deleted, together.
	// Default (0): 500.
	Chunk int
	// Progress, if set, is called after each chunk, the last one included,
	// with the number of jobs enqueued so far. An error it returns stops the
	// redrive before the next chunk (whose records stay dead letters, their
	// unique keys untaken), and RedriveWith returns it wrapped (errors.Is
	// finds it) with the count so far.
	Progress func(done int) error
}

// RedriveWith is Redrive in chunks with a progress callback. It lists the
// dead-letter queue once, whatever the number of chunks, so redriving N
// records costs O(N) on every backend; a caller that shows progress or
// pauses between chunks uses it rather than one Redrive call per chunk
// (each of which lists the whole queue).
func (p *Platform) RedriveWith(ctx context.Context, queue string, opt RedriveOptions, ids ...string) (int, error) {
	if opt.Chunk < 0 {
		return 0, fmt.Errorf("asyncplatform: redriving dead letters of queue %q: RedriveOptions.Chunk %d is negative", queue, opt.Chunk)
	}
	if opt.Chunk == 0 {
		opt.Chunk = 500
	}
	if p.backend == nil {
		return 0, ErrNotNew
	}
	if err := validQueue(queue); err != nil {
		return 0, err
	}
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	// Collect first: deleting while paging would shift the cursor.
	var picked []DeadLetter
	unsigned := 0
	var moved []string
	seen := make(map[string]bool)
	for cursor := ""; ; {
		page, err := p.DeadLetters(ctx, queue, cursor, 1000)
		if err != nil {
			return 0, err
		}
		for _, dl := range page.Letters {
			if dl.Raw != nil || seen[dl.ID] || (len(ids) > 0 && !want[dl.Job.ID] && !want[dl.ID]) {
				continue
			}
			if dl.signed && p.codec.Keys == nil { // its job would come back unsigned, and signed workers refuse it
				unsigned++
				continue
			}
			if p.codec.Keys != nil && dl.Queue != queue { // a signed record copied from another queue's dead letters
				moved = append(moved, dl.ID)
				continue
			}
			seen[dl.ID] = true
			picked = append(picked, dl)
		}
		if cursor = page.Next; cursor == "" {
			break
		}
	}
	done := 0
	var refused, skipped []error
	for len(picked) > 0 {
		chunk := picked[:min(len(picked), opt.Chunk)]
		picked = picked[len(chunk):]
		// A chunk's unique jobs take their keys again just before it is
		// redriven, so a stopped redrive leaves no key taken for a record
		// that stays.
		chunk, ref, skip, err := retakeKeys(ctx, p.claims, chunk)
		if err != nil {
			return done, err
		}
		refused, skipped = append(refused, ref...), append(skipped, skip...)
		if len(chunk) > 0 {
			n, err := p.rd.Chunk(ctx, queue, redriveLetters(chunk))
			done += n
			if err != nil {
				return done, err
			}
		}
		if opt.Progress != nil {
			if err := opt.Progress(done); err != nil {
				return done, fmt.Errorf("asyncplatform: redrive of queue %q stopped after %d jobs: %w", queue, done, err)
			}
		}
	}
	p.log.InfoContext(ctx, "asyncplatform: redrove dead letters", "queue", queue, "count", done)
	var errs []error
	if len(refused) > 0 {
		errs = append(errs, fmt.Errorf("asyncplatform: %d dead letters of queue %q stay: a newer job holds their unique key: %w", len(refused), queue, errors.Join(refused...)))
	}
	if len(skipped) > 0 {
		errs = append(errs, fmt.Errorf("asyncplatform: %d dead letters of queue %q stay: their unique claim is not one the platform writes: %w", len(skipped), queue, errors.Join(skipped...)))
	}
	if len(moved) > 0 {
		errs = append(errs, fmt.Errorf("asyncplatform: %w: %d signed dead letters read from queue %q were written for another queue, and stay (copies moved there); the first: %q",
			ErrInvalidJob, len(moved), queue, moved[:min(len(moved), 10)]))
	}
	if unsigned > 0 {
		errs = append(errs, fmt.Errorf("asyncplatform: %w: %d signed dead letters of queue %q were left: redrive them from a platform with the SigningKey", ErrNoSigningKey, unsigned, queue))
	}
	return done, errors.Join(errs...)
}

// redriveLetters is chunk as the redrive engine takes it.
func redriveLetters(chunk []DeadLetter) []redrive.Letter {
	out := make([]redrive.Letter, len(chunk))
	for i := range chunk {
		out[i] = redrive.Letter{ID: chunk[i].ID, Job: toWire(&chunk[i].Job)}
		out[i].Job.PayloadRef = chunk[i].PayloadRef
	}
	return out
}

// PurgeDeadLetters deletes every dead letter of the queue and returns how
// many it deleted.
func (p *Platform) PurgeDeadLetters(ctx context.Context, queue string) (int, error) {
	if p.backend == nil {
		return 0, ErrNotNew
	}
	if err := validQueue(queue); err != nil {
		return 0, err
	}
	removed := 0
	if p.payloads != nil {
		// Delete record by record, then the payloads they pointed at, so a
		// payload goes only once nothing points at it.
		for {
			page, err := p.DeadLetters(ctx, queue, "", 1000)
			if err != nil {
				return removed, err
			}
			var ids []string
			var refs []payload.Key
			for _, dl := range page.Letters {
				ids = append(ids, dl.ID)
				if dl.PayloadRef != "" {
					refs = append(refs, payload.Key{Job: dl.Job.ID, Ref: dl.PayloadRef})
				}
			}
			if len(ids) == 0 {
				break
			}
			n, err := p.backend.DeleteDead(ctx, queue, ids)
			removed += n
			if err != nil {
				return removed, fmt.Errorf("asyncplatform: purging dead letters of queue %q: %w", queue, err)
			}
			if n < len(ids) { // some were held: keep the payloads they still point at
				refs = p.rd.Unreferenced(ctx, queue, refs)
			}
			p.payloads.DropAll(ctx, refs)
			if n == 0 {
				break // the rest are held by NextDeadLetter callers
			}
		}
	}
	n, err := p.backend.PurgeDead(ctx, queue)
	n += removed
	if err != nil {
		return n, fmt.Errorf("asyncplatform: purging dead letters of queue %q: %w", queue, err)
	}
	p.log.InfoContext(ctx, "asyncplatform: purged dead letters", "queue", queue, "count", n)
	return n, nil
}
