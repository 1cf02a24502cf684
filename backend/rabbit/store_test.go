package rabbit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/conformance/storetest"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/testenv"
	"github.com/asyncplatform/asyncplatform/pgstore"
	"github.com/asyncplatform/asyncplatform/pgstore/pgtest"
)

// TestStoreNeedsCompanion checks that without Config.Store the backend has
// no shared state, and says so, naming the choices, to the platform too.
func TestStoreNeedsCompanion(t *testing.T) {
	t.Parallel()
	b := newBackend(t, Config{})
	_, err := b.Store()
	if !errors.Is(err, driver.ErrNoStore) {
		t.Fatalf("Store without Config.Store: %v, want ErrNoStore", err)
	}
	for _, want := range []string{"rabbit.Config.Store", "pgstore.New", "PostgreSQL", "Redis", "NATS"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error %q does not name %s", err, want)
		}
	}
	p, err := ap.New(b, ap.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Store(); !errors.Is(err, ap.ErrNoStore) || !strings.Contains(err.Error(), "rabbit.Config.Store") {
		t.Fatalf("Platform.Store on RabbitMQ without a companion: %v, want ErrNoStore naming rabbit.Config.Store", err)
	}
	s := ap.Schedule{Name: "s", Every: time.Second, Job: ap.Job{Type: "t"}}
	if err := p.Schedule(s); !errors.Is(err, ap.ErrNoStore) || !strings.Contains(err.Error(), "rabbit.Config.Store") {
		t.Fatalf("Schedule on RabbitMQ without a companion: %v, want ErrNoStore naming rabbit.Config.Store (a schedule that never fires)", err)
	}
	if _, err := ap.New(b, ap.Config{Schedules: []ap.Schedule{s}}); !errors.Is(err, ap.ErrNoStore) {
		t.Fatalf("New with Schedules on RabbitMQ without a companion: %v, want ErrNoStore", err)
	}
}

// TestSchedulesRefusedAfterStart: a started platform on RabbitMQ without a
// companion store refuses a schedule as before Start (it would never
// fire), and lists none.
func TestSchedulesRefusedAfterStart(t *testing.T) {
	t.Parallel()
	var r [4]byte
	_, _ = rand.Read(r[:])
	b := newBackend(t, Config{Prefix: "st" + hex.EncodeToString(r[:])})
	t.Cleanup(func() {
		_ = b.withChannel(context.Background(), func(ch *amqp.Channel) error {
			_, err := ch.QueueDelete(b.registryName(), false, false, false)
			return err
		})
	})
	q := queueName(t, b)
	p, err := ap.New(b, ap.Config{Queues: map[string]ap.QueueConfig{q: {}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop(context.Background()) })
	s := ap.Schedule{Name: "s", Every: time.Second, Job: ap.Job{Type: "t", Queue: q}}
	if err := p.Schedule(s); !errors.Is(err, ap.ErrNoStore) {
		t.Fatalf("Schedule after Start on RabbitMQ without a companion: %v, want ErrNoStore", err)
	}
	if _, err := p.Schedules(ctx); !errors.Is(err, ap.ErrNoStore) {
		t.Fatalf("Schedules on RabbitMQ without a companion: %v, want ErrNoStore", err)
	}
}

// TestStoreCompanionScoped checks that the companion's keys are kept under
// the backend's prefix: two platforms of different prefixes share one
// companion without meeting.
func TestStoreCompanionScoped(t *testing.T) {
	t.Parallel()
	companion, _ := memory.New(t.Context(), memory.Config{})
	ctx := t.Context()
	var stores []*ap.Store
	for _, prefix := range []string{"apt-one", "apt-two"} {
		b := newBackend(t, Config{Prefix: prefix, Store: companion})
		p, err := ap.New(b, ap.Config{})
		if err != nil {
			t.Fatal(err)
		}
		s, err := p.Store()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Create(ctx, "flag", []byte(prefix), 0); err != nil {
			t.Fatalf("%s: %v", prefix, err)
		}
		stores = append(stores, s)
	}
	for i, prefix := range []string{"apt-one", "apt-two"} {
		v, _, err := stores[i].Get(ctx, "flag")
		if err != nil || string(v) != prefix {
			t.Errorf("%s reads %q, %v; want its own value", prefix, v, err)
		}
		page, err := stores[i].List(ctx, "", "", 10)
		if err != nil || !slices.Equal(page.Keys, []string{"flag"}) {
			t.Errorf("%s lists %q, %v; want [flag]", prefix, page.Keys, err)
		}
	}
	keys, err := companion.List(ctx, "", "", 10)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"apt-one/app/flag", "apt-two/app/flag"}; !slices.Equal(keys, want) {
		t.Fatalf("the companion holds %q, want %q", keys, want)
	}
}

// TestStore runs the store suite on the backend's store with a PostgreSQL
// companion, the one RabbitMQ users most likely run: the machine's, and for
// Durability/Restart one of the test's own (pgtest), restarted by a SIGKILL
// of every server process. The backend's store is the companion's, so the
// restart that matters is the companion's; RabbitMQ keeps no store state.
func TestStore(t *testing.T) {
	t.Parallel()
	pgURL := sharedPG(2)
	storetest.Run(t, companionOn(pgURL, true), storetest.Options{
		Restart: func(t *testing.T) (storetest.Maker, func(*testing.T)) {
			srv := pgtest.Start(t)
			return companionOn(srv.URL, false), func(t *testing.T) {
				if err := srv.Restart(true); err != nil {
					t.Fatal(err)
				}
			}
		},
	})
}

// companionOn opens each store as the store of a backend of its own with a
// pgstore companion on the PostgreSQL at url. When shared (the machine's
// server) is true, an unreachable server skips the test (fails it under
// ASYNCPLATFORM_REQUIRE_SERVERS); a server of the test's own fails it.
func companionOn(url string, shared bool) storetest.Maker {
	return func(ctx context.Context, tb testing.TB) (driver.Store, error) {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		pg, err := pgstore.New(pctx, pgstore.Config{URL: url, Table: "asyncplatform_store_test"})
		if err != nil && shared {
			testenv.Unreachable(tb, "PostgreSQL at "+url, err)
		}
		if err != nil {
			return nil, err
		}
		tb.Cleanup(func() { pg.Close() })
		return newBackend(tb, Config{Prefix: "apt-store", Store: pg}).Store()
	}
}
