package executor

import (
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/internal/decide"
	"github.com/asyncplatform/asyncplatform/internal/wire"
)

// typed is a Handler with its type's policy.
type typed struct{ Handler[view] }

func (typed) Policy() wire.Policy {
	n := 2
	return wire.Policy{RetryLimit: &n, Timeout: time.Hour}
}

// For each field the job's own policy wins, then its type's, its queue's,
// the platform's, then the default.
func TestPoliciesPrecedence(t *testing.T) {
	three, one, nine := 3, 1, 9
	ps := Policies{
		Queues:   map[string]wire.Policy{"q": {RetryLimit: &three, PoisonLimit: &one}},
		Platform: wire.Policy{PoisonLimit: &nine, BackoffBase: time.Millisecond},
		Defaults: decide.Policy{RetryLimit: 10, PoisonLimit: 3, BackoffBase: time.Second, BackoffCap: time.Minute, Timeout: time.Minute},
	}
	j := &Job{Job: wire.Job{Policy: wire.Policy{Timeout: time.Second}}, Queue: "q"}
	want := decide.Policy{RetryLimit: 2, PoisonLimit: 1, BackoffBase: time.Millisecond, BackoffCap: time.Minute, Timeout: time.Second}
	if got := ps.Of(j, typed{}); got != want {
		t.Errorf("with the type's policy: %+v; want %+v", got, want)
	}
	want.RetryLimit = 3
	if got := ps.Of(j, nil); got != want {
		t.Errorf("without a handler: %+v; want %+v", got, want)
	}
}
