package asyncplatform

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
)

// The default limits refuse, at Enqueue and with a typed error, what a
// backend with no limit of its own (memory, Redis) once accepted: a million
// headers, a 100 MB payload.
func TestEnqueueLimits(t *testing.T) {
	ctx := context.Background()
	p, err := New(memory.NewBroker().Connect(), Config{Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	many := map[string]string{}
	for i := range DefaultMaxHeaders + 1 {
		many[fmt.Sprint(i)] = "v"
	}
	var le *LimitError
	err = p.Enqueue(ctx, &Job{Type: "t", Headers: many})
	if !errors.Is(err, ErrInvalidJob) || !errors.As(err, &le) || le.Limit != "MaxHeaders" {
		t.Errorf("%d headers: %v, want a MaxHeaders LimitError matching ErrInvalidJob", len(many), err)
	}
	err = p.Enqueue(ctx, &Job{Type: "t", Headers: map[string]string{"k": strings.Repeat("v", DefaultMaxHeaderBytes)}})
	if !errors.As(err, &le) || le.Limit != "MaxHeaderBytes" {
		t.Errorf("a %d-byte header: %v, want a MaxHeaderBytes LimitError", DefaultMaxHeaderBytes, err)
	}
	err = p.Enqueue(ctx, &Job{Type: "t", Payload: make([]byte, 100<<20)})
	if !errors.Is(err, ErrPayloadTooLarge) {
		t.Errorf("a 100 MB payload: %v, want ErrPayloadTooLarge", err)
	}
	if m := p.MaxPayload(Job{Type: "t"}); m <= 16<<20 || m >= DefaultMaxMessage {
		t.Errorf("MaxPayload = %d, want just under DefaultMaxMessage", m)
	}
	if err := p.Enqueue(ctx, &Job{Type: "t", Payload: make([]byte, p.MaxPayload(Job{Type: "t"}))}); err != nil {
		t.Errorf("a payload of MaxPayload bytes: %v", err)
	}
	if maxHeadersLimit != 9_996 { // the number Config.MaxHeaders and docs/security.md state
		t.Errorf("maxHeadersLimit is %d; Config.MaxHeaders's doc and docs/security.md say 9,996", maxHeadersLimit)
	}
	if _, err := New(memory.NewBroker().Connect(), Config{MaxHeaders: maxHeadersLimit + 1}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("MaxHeaders over maxHeadersLimit: %v", err)
	}
}

// logBuffer collects log lines, for checks on what is logged.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A 5 MB handler error is cut in the dead letter to Config.MaxErrorText,
// saying so, and in the log to one line of at most 1 KiB.
func TestErrorTextIsBounded(t *testing.T) {
	ctx := context.Background()
	var logs logBuffer
	b := memory.NewBroker().Connect()
	p, err := New(b, Config{Logger: slog.New(slog.NewTextHandler(&logs, nil)), Policy: Policy{RetryLimit: Limit(0)}})
	if err != nil {
		t.Fatal(err)
	}
	huge := strings.Repeat("x", 5<<20)
	_ = p.Handle("t", func(context.Context, *Job) error { return errors.New(huge) })
	dead := make(chan DeadLetter, 1)
	p.cfg.Hooks.OnDeadLetter = func(_ context.Context, dl DeadLetter) { dead <- dl }
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Stop(ctx)
	if err := p.Enqueue(ctx, &Job{Type: "t"}); err != nil {
		t.Fatal(err)
	}
	var dl DeadLetter
	select {
	case dl = <-dead:
	case <-time.After(10 * time.Second):
		t.Fatal("not dead-lettered")
	}
	if len(dl.Error) > DefaultMaxErrorText+200 || !strings.Contains(dl.Error, "cut") {
		t.Errorf("the dead letter keeps %d bytes of a %d-byte error", len(dl.Error), len(huge))
	}
	for _, line := range strings.Split(logs.String(), "\n") {
		if len(line) > 2048 {
			t.Errorf("a %d-byte log line: %.120s…", len(line), line)
		}
	}
}

// With a SigningKey, workers run only jobs signed with it; anything else is
// dead-lettered as invalid ("bad signature") with its raw bytes, and a
// dead-letter record not signed with it is shown raw and never redriven.
func TestSigning(t *testing.T) {
	ctx := context.Background()
	broker := memory.NewBroker()
	key := []byte("0123456789abcdef0123456789abcdef")
	newP := func(key []byte, verify ...[]byte) *Platform {
		p, err := New(broker.Connect(), Config{Logger: quietLog, SigningKey: key, VerifyKeys: verify, Policy: Policy{RetryLimit: Limit(0)}})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	if _, err := New(broker.Connect(), Config{SigningKey: []byte("short")}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("a 5-byte key: %v, want ErrInvalidConfig", err)
	}
	signer, stranger := newP(key), newP(nil)
	rotated := newP([]byte("fedcba9876543210fedcba9876543210"), key)
	for _, j := range []*Job{{ID: "signed", Type: "t"}, {ID: "unsigned", Type: "t"}, {ID: "forged", Type: "t"}} {
		var err error
		switch j.ID {
		case "signed":
			err = signer.Enqueue(ctx, j)
		case "unsigned":
			err = stranger.Enqueue(ctx, j)
		case "forged":
			forger, ferr := New(broker.Connect(), Config{Logger: quietLog, SigningKey: []byte("not-the-key-not-the-key-not-the")})
			if ferr != nil {
				t.Fatal(ferr)
			}
			err = forger.Enqueue(ctx, j)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	ran := make(chan string, 3)
	_ = rotated.Handle("t", func(_ context.Context, j *Job) error { ran <- j.ID; return nil })
	if err := rotated.Start(ctx); err != nil {
		t.Fatal(err)
	}
	// The signed job is waited for before Stop: one claimed but not yet
	// started at Stop is handed back unrun.
	var first string
	select {
	case first = <-ran:
	case <-time.After(30 * time.Second):
		t.Fatal("the signed job did not run within 30s")
	}
	waitUntil(t, "two dead letters", func() bool {
		st, _ := rotated.Stats(ctx, DefaultQueue)
		return st.Dead == 2
	})
	_ = rotated.Stop(ctx)
	if first != "signed" || len(ran) != 0 {
		t.Errorf("ran %q and %d more, want only the signed job (under a VerifyKey)", first, len(ran))
	}
	page, err := rotated.DeadLetters(ctx, DefaultQueue, "", 10)
	if err != nil {
		t.Fatal(err)
	}
	for _, dl := range page.Letters {
		if dl.Reason != ReasonInvalid || !strings.Contains(dl.Error, "bad signature") || len(dl.Raw) == 0 {
			t.Errorf("dead letter %s: %s %q, raw %d bytes; want invalid, bad signature, the raw bytes", dl.ID, dl.Reason, dl.Error, len(dl.Raw))
		}
	}
	// The records are signed: a platform without the key reads them; one with
	// another key sees them raw and does not redrive them.
	if n, err := newP([]byte("another-key-another-key-another-")).Redrive(ctx, DefaultQueue); err != nil || n != 0 {
		t.Errorf("redrive under another key: %d, %v; want 0 (the records fail the check)", n, err)
	}
	if page, _ := stranger.DeadLetters(ctx, DefaultQueue, "", 10); len(page.Letters) != 2 || page.Letters[0].Worker == "" {
		t.Errorf("a platform without a key lists %+v", page.Letters)
	}
}

// A Platform that New did not make refuses politely instead of panicking,
// and Start after Stop says so.
func TestMisuse(t *testing.T) {
	ctx := context.Background()
	var zero Platform
	if err := zero.Enqueue(ctx, &Job{Type: "t"}); !errors.Is(err, ErrNotNew) {
		t.Errorf("Enqueue on Platform{}: %v", err)
	}
	if err := zero.Start(ctx); !errors.Is(err, ErrNotNew) {
		t.Errorf("Start on Platform{}: %v", err)
	}
	if _, err := zero.Redrive(ctx, DefaultQueue); !errors.Is(err, ErrNotNew) {
		t.Errorf("Redrive on Platform{}: %v", err)
	}
	p, _ := New(memory.NewBroker().Connect(), Config{Logger: quietLog})
	_ = p.Start(ctx)
	_ = p.Stop(ctx)
	if err := p.Start(ctx); !errors.Is(err, ErrStopped) || strings.Contains(err.Error(), "closed") {
		t.Errorf("Start after Stop: %v, want ErrStopped (not a closed backend)", err)
	}
}

func TestKeyAndMessageLimits(t *testing.T) {
	key := []byte("0123456789abcdef")
	for name, cfg := range map[string]Config{
		"an empty VerifyKey": {SigningKey: key, VerifyKeys: [][]byte{nil}},
		"a short VerifyKey":  {SigningKey: key, VerifyKeys: [][]byte{[]byte("old")}},
		"a tiny MaxMessage":  {MaxMessage: 100},
	} {
		if _, err := New(memory.NewBroker().Connect(), cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
}

// A platform without the SigningKey leaves signed dead letters where they
// are and says so: redriven by it, their jobs would be unsigned and signed
// workers would refuse them.
func TestKeylessRedriveLeavesSignedRecords(t *testing.T) {
	ctx := context.Background()
	broker := memory.NewBroker()
	key := []byte("0123456789abcdef0123456789abcdef")
	signer, _ := New(broker.Connect(), Config{Logger: quietLog, SigningKey: key, Policy: Policy{RetryLimit: Limit(0)}})
	_ = signer.Handle("t", func(context.Context, *Job) error { return Permanent(errors.New("no")) })
	_ = signer.Enqueue(ctx, &Job{Type: "t"})
	if err := signer.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the dead letter", func() bool { st, _ := signer.Stats(ctx, DefaultQueue); return st.Dead == 1 })
	_ = signer.Stop(ctx)
	keyless, _ := New(broker.Connect(), Config{Logger: quietLog})
	if n, err := keyless.Redrive(ctx, DefaultQueue); n != 0 || !errors.Is(err, ErrNoSigningKey) {
		t.Errorf("keyless redrive: %d, %v; want 0 and ErrNoSigningKey", n, err)
	}
	if n, err := signer.Redrive(ctx, DefaultQueue); n != 1 || err != nil {
		t.Errorf("redrive with the key: %d, %v", n, err)
	}
}
