package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// Azure's dead letters for the depth phase. Making them through handlers
// (the platform's worker loop, a round of 1,000 at a time) took from 10 s
// to several minutes a round on Azurite, so past the first one they are
// made by the backend's own dead-letter write, as PostgreSQL's shortcut
// copies its record with SQL.
const (
	azureDeadRound  = 1000 // messages enqueued and dead-lettered together
	azureDeadTakers = 4    // concurrent Receive loops
	azureDeadBatch  = 32   // messages a Receive takes
)

// fillAzureDead makes n dead letters on Azure: one through a handler that
// fails, so that its record is the platform's, then n-1 copies of that
// record, each under a record ID of its own (the first's with "-2",
// "-3", ...): raw messages are enqueued, received by the backend directly
// and dead-lettered with the copy by Backend.DeadLetter (the blob write and
// the message delete a handler's dead letter costs), azureDeadTakers
// receive loops at a time, azureDeadRound messages a round so that the
// queue Azurite walks on every receive stays small. The copies are one
// job's: a redrive of them enqueues that job n times, each copy a message
// of its own.
func fillAzureDead(ctx context.Context, f *facade, n int) error {
	if err := fill(ctx, f, 1); err != nil {
		return err
	}
	if err := dead(ctx, f, 1); err != nil {
		return err
	}
	recs, _, err := f.be.ListDead(ctx, f.queue, "", 2)
	if err != nil {
		return err
	}
	if len(recs) != 1 {
		return fmt.Errorf("%d dead letters after the first, want 1", len(recs))
	}
	rec := recs[0]
	for made := 1; made < n; {
		k := min(azureDeadRound, n-made)
		msgs := make([]driver.Message, k)
		for i := range msgs {
			msgs[i] = driver.Message{ID: fmt.Sprint("fill-", made+i), Body: []byte("x")}
		}
		if err := f.be.Enqueue(ctx, f.queue, msgs); err != nil {
			return err
		}
		if err := deadLetterRaw(ctx, f, rec, made, k); err != nil {
			return fmt.Errorf("%d dead letters made, then: %w", made, err)
		}
		made += k
	}
	return nil
}

// deadLetterRaw receives k waiting messages and dead-letters each with a
// copy of rec whose ID is rec.ID and its number, from from+1.
func deadLetterRaw(ctx context.Context, f *facade, rec driver.DeadMessage, from, k int) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	// rctx ends the receives once all k are taken: a Receive of an empty
	// queue waits.
	rctx, allTaken := context.WithCancel(ctx)
	defer allTaken()
	var (
		mu    sync.Mutex
		taken int // messages received so far
		errs  []error
		wg    sync.WaitGroup
	)
	failed := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
		cancel()
	}
	// reserve numbers the received ds from the first free one.
	reserve := func(ds int) int {
		mu.Lock()
		defer mu.Unlock()
		first := from + taken
		taken += ds
		if taken >= k {
			allTaken()
		}
		return first
	}
	for range azureDeadTakers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for rctx.Err() == nil {
				ds, err := f.be.Receive(rctx, f.queue, azureDeadBatch, 2*time.Minute)
				if err != nil {
					if rctx.Err() == nil || ctx.Err() != nil {
						failed(err)
					}
					return
				}
				first := reserve(len(ds))
				var dw sync.WaitGroup
				for i, d := range ds {
					dw.Add(1)
					go func() {
						defer dw.Done()
						id := rec.ID + "-" + strconv.Itoa(first+i+1)
						if err := f.be.DeadLetter(ctx, d, driver.DeadMessage{ID: id, Body: rec.Body}); err != nil {
							failed(fmt.Errorf("dead-lettering copy %s: %w", id, err))
						}
					}()
				}
				dw.Wait()
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if taken < k {
		return fmt.Errorf("%d of %d messages received: %w", taken, k, ctx.Err())
	}
	return nil
}
