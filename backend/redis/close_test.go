package redis

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	goredis "github.com/redis/go-redis/v9"

	"github.com/asyncplatform/asyncplatform/driver"
)

// holdScripts holds every script call until release is closed.
type holdScripts struct {
	started chan struct{}
	release chan struct{}
}

func (holdScripts) DialHook(next goredis.DialHook) goredis.DialHook { return next }
func (holdScripts) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}
func (h holdScripts) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if strings.HasPrefix(cmd.Name(), "eval") {
			select {
			case h.started <- struct{}{}:
			default:
			}
			<-h.release
		}
		return next(ctx, cmd)
	}
}

// TestReceiveClosedMidClaim: a Receive whose claim is under way when Close
// is called, and whose client its owner closes right after (as a process
// shutting down does), ends with driver.ErrClosed, not the client's error
// (Close/ErrClosed failed on miniredis in CI this way).
func TestReceiveClosedMidClaim(t *testing.T) {
	c := goredis.NewClient(&goredis.Options{Addr: miniredis.RunT(t).Addr()})
	defer c.Close()
	b, err := New(context.Background(), Config{Client: c, Prefix: "aptclose", IdleWait: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	h := holdScripts{started: make(chan struct{}, 1), release: make(chan struct{})}
	c.AddHook(h)
	got := make(chan error, 1)
	go func() {
		_, err := b.Receive(context.Background(), testQueue(t), 1, time.Minute)
		got <- err
	}()
	select {
	case <-h.started:
	case <-time.After(30 * time.Second):
		t.Fatal("the Receive's claim did not start")
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	c.Close()
	close(h.release)
	select {
	case err := <-got:
		if !errors.Is(err, driver.ErrClosed) {
			t.Errorf("Receive: %v, want driver.ErrClosed", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the Receive did not end")
	}
}
