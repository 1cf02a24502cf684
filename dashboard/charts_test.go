package dashboard_test

import (
	"context"
	"strings"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/dashboard"
)

// The attempts caption counts as failed jobs only those dead-lettered (an
// attempt that will be retried is said apart), and its rate is over the
// last minute, so that a few jobs a minute do not read "0.0/s".
func TestAttemptsCaption(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{})
	at := time.Unix(0, 0).Add(1_000_000 * dashboard.BucketWidth).Add(5 * time.Second) // 5 s into an interval
	f.rec.SetClock(func() time.Time { return at })
	for _, o := range []ap.Outcome{ap.OutcomeSucceeded, ap.OutcomeSucceeded, ap.OutcomeRetried, ap.OutcomeRetried, ap.OutcomeDeadLettered} {
		f.rec.AfterAttempt(context.Background(), ap.Attempt{Job: &ap.Job{Queue: "mail"}, Outcome: o})
	}
	_, body := newClient(t, f).get("/queue?q=mail")
	// 5 attempts over the last 55 s: 0.09/s.
	if want := "2 succeeded, 2 retried, 1 dead-lettered (33.3 % of the jobs that ended) · 0.09/s in the last minute"; !strings.Contains(body, want) {
		t.Errorf("the attempts caption lacks %q:\n%s", want, body)
	}
}
