package sqlite

import (
	"context"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/driver"
)

func TestParseURL(t *testing.T) {
	u, _ := url.Parse("sqlite:///var/lib/app/jobs.db?prefix=shop&dead_hold=1m&idle_wait=200ms&busy_timeout=30s&max_body=4096&max_conns=3")
	cfg, err := parseURL(u)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Path != "/var/lib/app/jobs.db" || cfg.Prefix != "shop" || cfg.DeadHold != time.Minute || cfg.IdleWait != 200*time.Millisecond ||
		cfg.BusyTimeout != 30*time.Second || cfg.MaxBody != 4096 || cfg.MaxConns != 3 {
		t.Errorf("parsed %+v", cfg)
	}
	for _, bad := range []string{
		"sqlite://host/jobs.db",           // a host: two slashes
		"sqlite:jobs.db",                  // opaque
		"sqlite:///",                      // no file
		"sqlite:///x.db?dead_hold=soon",   // not a duration
		"sqlite:///x.db?max_body=-1",      // not positive
		"sqlite:///x.db?journal_mode=off", // not ours: refused, never passed to SQLite
		"sqlite://u:pw@/x.db",             // a user
	} {
		u, err := url.Parse(bad)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := parseURL(u); err == nil {
			t.Errorf("%s parsed", bad)
		}
	}
}

// TestOpenSurvivesRestart opens a sqlite URL through asyncplatform.Open,
// enqueues a job and closes the backend without working it; a backend
// opened again on the file hands the job out.
func TestOpenSurvivesRestart(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	addr := "sqlite://" + filepath.Join(t.TempDir(), "open.db") + "?prefix=opened"
	b, err := ap.Open(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Enqueue(ctx, "restart", []driver.Message{{ID: "1", Body: []byte("kept")}}); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Enqueue(ctx, "restart", nil); err != driver.ErrClosed {
		t.Errorf("Enqueue after Close: %v, want ErrClosed", err)
	}
	b, err = ap.Open(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	qs, err := b.(driver.QueueLister).Queues(ctx)
	if err != nil || len(qs) != 1 || qs[0] != "restart" {
		t.Errorf("Queues = %q, %v; want [restart]", qs, err)
	}
	ds, err := b.Receive(ctx, "restart", 10, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 1 || string(ds[0].Body) != "kept" || ds[0].Deliveries != 1 {
		t.Fatalf("received %d deliveries (%+v), want the one job enqueued before the restart", len(ds), ds)
	}
	if err := b.Ack(ctx, ds[0]); err != nil {
		t.Fatal(err)
	}
}

// TestNewRefusesOtherSchema: a file whose tables are of another schema
// version is refused, naming both versions.
func TestNewRefusesOtherSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "schema.db")
	b, err := New(ctx, Config{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.ExecContext(ctx, `UPDATE asyncplatform_schema SET version = 99`); err != nil {
		t.Fatal(err)
	}
	b.Close()
	if b, err := New(ctx, Config{Path: path}); err == nil {
		b.Close()
		t.Fatal("opened a file of schema version 99")
	} else {
		t.Log(err)
	}
}
