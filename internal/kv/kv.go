// Package kv holds what every engine of the platform shares about its state
// in the backend's store: the namespaces it keeps that state in, and the one
// compare-and-swap retry policy every read-modify-write loop follows.
package kv

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// Namespace is a part of the store the platform keeps for one engine's
// state. Every namespace starts with '_', which user namespaces
// (asyncplatform.NewStore) may not, so no user key can collide with one.
type Namespace string

// The platform's namespaces. The names are stored on brokers: never rename
// one without moving its keys.
const (
	Limits       Namespace = "_limit"    // cluster-wide type limits: slots and rates
	Flow         Namespace = "_flow"     // paused queues and groups
	Schedules    Namespace = "_schedule" // each schedule's last tick fired
	ScheduleDefs Namespace = "_scheddef" // each schedule's definition, for operators
	Status       Namespace = "_jobs"     // job status records and cancel marks
	Unique       Namespace = "_unique"   // unique-key claims
	Workflows    Namespace = "_workflow" // workflow and step records
	Workers      Namespace = "_workers"  // each running platform's heartbeat record
	History      Namespace = "_history"  // throughput counts per minute
)

// All lists every namespace of the platform.
var All = []Namespace{Limits, Flow, Schedules, ScheduleDefs, Status, Unique, Workflows, Workers, History}

// Prefix is the key prefix of the namespace: its name and a '/'.
func (n Namespace) Prefix() string { return string(n) + "/" }

// MaxTries is how many times Retry runs a step that keeps meeting a
// conflict before it gives up.
const MaxTries = 16

// maxPause bounds the pause between two tries.
const maxPause = 16 * time.Millisecond

// ErrRetry is returned by a Retry step whose write met a conflict (another
// writer changed the key since it was read, or created it first): Retry
// runs the step again, which reads again.
var ErrRetry = errors.New("kv: conflict, try again")

// ErrContended is matched (errors.Is) by Retry's error when the step met a
// conflict MaxTries times in a row.
var ErrContended = errors.New("kv: the key kept changing")

// Retry runs step, a read-modify-write of one key by compare-and-swap, until
// it returns anything but ErrRetry, and returns that. The policy, the same
// for every engine: the first conflict is tried again at once; each later
// one after a random pause of up to 2^n ms (at most 16 ms), so that writers
// that keep meeting spread apart. After MaxTries tries it gives up with an
// error that matches ErrContended; when ctx ends during a pause it returns
// ctx.Err().
func Retry(ctx context.Context, step func() error) error {
	for try := 1; ; try++ {
		err := step()
		if !errors.Is(err, ErrRetry) {
			return err
		}
		if try == MaxTries {
			return fmt.Errorf("%w after %d tries", ErrContended, MaxTries)
		}
		if try == 1 {
			continue
		}
		if err := ctx.Err(); err != nil { // a pause drawn as zero would not see it
			return err
		}
		d := rand.N(min(time.Millisecond<<(try-1), maxPause) + 1)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}
