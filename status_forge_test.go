package asyncplatform

import (
	"context"
	"testing"
	"time"
)

// A forged message naming a tracked job's ID with a huge copy number (a
// writer to the broker, who cannot read the job's status nonce) does not
// take over the job's status: the status stays the job's, Cancel still
// reaches it, and the job then runs tracked.
func TestStatusForgedCopyIgnored(t *testing.T) {
	t.Parallel()
	forgedRan := make(chan struct{}, 1)
	p := startPlatform(t, Config{TrackStatus: true}, map[string]Handler{
		"real": func(ctx context.Context, j *Job) error { return nil },
		"forged": func(ctx context.Context, j *Job) error {
			j.SetResult([]byte("forged"))
			forgedRan <- struct{}{}
			return nil
		},
	})
	ctx := context.Background()
	victim := &Job{Type: "real", NotBefore: time.Now().Add(time.Hour)}
	if err := p.Enqueue(ctx, victim); err != nil {
		t.Fatal(err)
	}
	forgeJob(t, p, DefaultQueue, &Job{ID: victim.ID, Type: "forged", copyNo: 1 << 62})
	<-forgedRan
	time.Sleep(100 * time.Millisecond) // its settle follows the handler
	st, err := p.Status(ctx, victim.ID)
	if err != nil || st.State != StateScheduled || st.Result != nil || st.Copy != 0 {
		t.Fatalf("after a forged copy ran: %+v, %v; want the victim's scheduled status", st, err)
	}
	if err := p.Cancel(ctx, victim.ID); err != nil {
		t.Fatalf("Cancel after a forged copy ran: %v", err)
	}
	if st, _ := p.Status(ctx, victim.ID); !st.CancelRequested {
		t.Fatalf("after Cancel: %+v", st)
	}
}
