package asyncplatform

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
)

type downStore struct{ *memory.Backend }

var errDown = errors.New("store unreachable")

func (downStore) Get(context.Context, string) ([]byte, string, error) { return nil, "", errDown }
func (downStore) Create(context.Context, string, []byte, time.Duration) (string, error) {
	return "", errDown
}

// The errors of the platform's own store calls are *StoreError values, like
// a Store's.
func TestPlatformStoreErrors(t *testing.T) {
	ctx := context.Background()
	p, err := New(downStore{memory.NewBroker().Connect()}, Config{Logger: quietLog, TrackStatus: true})
	if err != nil {
		t.Fatal(err)
	}
	var se *StoreError
	_, err = p.Status(ctx, "x")
	t.Logf("Status: %v (As *StoreError: %v, Is errDown: %v)", err, errors.As(err, &se), errors.Is(err, errDown))
	if !errors.As(err, &se) {
		t.Errorf("Status's store error is no *StoreError")
	}
	if !errors.Is(err, errDown) {
		t.Errorf("Status's error does not reach its cause: %v", err)
	}
	err = p.Pause(ctx, "q")
	if !errors.As(err, &se) || se.Op == "" || !errors.Is(err, errDown) {
		t.Errorf("Pause: %v, want a *StoreError naming its operation and reaching its cause", err)
	}
}
