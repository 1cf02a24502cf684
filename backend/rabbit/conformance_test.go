package rabbit

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/asyncplatform/asyncplatform/conformance"
	"github.com/asyncplatform/asyncplatform/conformance/faults"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/testenv"
	"github.com/asyncplatform/asyncplatform/pgstore"
)

// harness opens backends on the machine's broker, each through a loopback
// proxy of its own so that Disconnect can cut its connection as the network
// would. Every backend sees the same queues; a test closes one to play a
// dead worker.
type harness struct {
	url   *url.URL
	log   *slog.Logger
	store driver.Store // the companion store every backend carries

	mu      sync.Mutex
	proxies map[driver.Backend][]*proxy
}

var _ conformance.Disconnecter = (*harness)(nil)

// MakeBackend opens a backend through proxies of its own, one per node of
// the harness's URL (a cluster's URL lists several).
func (h *harness) MakeBackend(ctx context.Context) (driver.Backend, error) {
	var pxs []*proxy
	closeAll := func() {
		for _, px := range pxs {
			px.close()
		}
	}
	var hosts []string
	for _, host := range strings.Split(h.url.Host, ",") {
		px, err := newProxy(host)
		if err != nil {
			closeAll()
			return nil, err
		}
		pxs = append(pxs, px)
		hosts = append(hosts, px.ln.Addr().String())
	}
	u := *h.url
	u.Host = strings.Join(hosts, ",")
	b, err := New(ctx, Config{
		URL:          u.String(),
		Logger:       h.log,
		Store:        h.store,
		ReconnectMin: 10 * time.Millisecond,
		ReconnectMax: 200 * time.Millisecond,
	})
	if err != nil {
		closeAll()
		return nil, err
	}
	h.mu.Lock()
	h.proxies[b] = pxs
	h.mu.Unlock()
	return b, nil
}

// Disconnect cuts the backend's connection; it reconnects by itself.
func (h *harness) Disconnect(ctx context.Context, b driver.Backend) error {
	h.mu.Lock()
	pxs := h.proxies[b]
	h.mu.Unlock()
	if pxs == nil {
		return errors.New("rabbit harness: Disconnect of a backend this harness did not make")
	}
	for _, px := range pxs {
		px.cut()
	}
	return nil
}

// Close closes the proxies; the suite has closed the backends by then.
func (h *harness) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, pxs := range h.proxies {
		for _, px := range pxs {
			px.close()
		}
	}
	h.proxies = nil
}

func TestConformance(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	probe, err := New(ctx, Config{URL: testURL()})
	cancel()
	if err != nil {
		testenv.Unreachable(t, "RabbitMQ at "+redact(testURL()), err)
	}
	probe.Close()
	runConformance(t, testURL())
}

// runConformance runs the conformance suite on the broker (or cluster) of
// rawURL, with PostgreSQL as the companion store.
func runConformance(t *testing.T, rawURL string) {
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	pgURL := sharedPG(4)
	pctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	pg, err := pgstore.New(pctx, pgstore.Config{URL: pgURL, Table: "asyncplatform_conformance"})
	cancel()
	if err != nil {
		testenv.Unreachable(t, "PostgreSQL at "+pgURL+" (the companion store of unique and periodic jobs)", err)
	}
	t.Cleanup(func() { pg.Close() })
	conformance.Run(t, func(ctx context.Context, t *testing.T) (conformance.Harness, error) {
		return &harness{
			url:     u,
			store:   pg,
			log:     slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
			proxies: map[driver.Backend][]*proxy{},
		}, nil
	}, conformance.Options{})
}

// sharedPG returns the URL of the machine's PostgreSQL (pgstore.URLEnv, or
// the default test server) with the pool of a store opened on it bounded
// to maxConns connections, unless the URL bounds it itself. The server is
// shared (100 connections) by every test process and their child
// processes, each with stores of its own; an unbounded pool grows with the
// CPUs (pgxpool's default), and a process that cannot connect runs
// nothing ("sorry, too many clients already").
func sharedPG(maxConns int) string {
	u := testenv.Getenv(pgstore.URLEnv, "postgres://postgres@127.0.0.1:5432/test")
	if strings.Contains(u, "pool_max_conns") {
		return u
	}
	if !strings.Contains(u, "://") { // key=value pairs
		return fmt.Sprintf("%s pool_max_conns=%d", u, maxConns)
	}
	sep := "?"
	if strings.Contains(u, "?") {
		sep = "&"
	}
	return fmt.Sprintf("%s%spool_max_conns=%d", u, sep, maxConns)
}

// faultsPrefix is the prefix of the fault suite's queues.
const faultsPrefix = "faults"

// faultsStore is the companion store of the fault suite's backends, one
// per process (the suite's workers are child processes): PostgreSQL, as in
// runConformance, so the dead letters live in it (see deadstore.go).
var faultsStore = sync.OnceValues(func() (driver.Store, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pgURL := sharedPG(4)
	pg, err := pgstore.New(ctx, pgstore.Config{URL: pgURL, Table: "asyncplatform_faults"})
	if err != nil {
		return nil, fmt.Errorf("the fault suite's companion store, PostgreSQL at %s: %w", pgURL, err)
	}
	return pg, nil
})

// TestFaults runs the fault suite (conformance/faults) on the machine's
// broker, and BrokerRestart and BrokerKill on a RabbitMQ node of its own,
// with a PostgreSQL companion store.
func TestFaults(t *testing.T) {
	t.Parallel()
	u := testURL()
	conn, err := amqp.DialConfig(u, amqp.Config{Dial: amqp.DefaultDial(2 * time.Second)})
	if err != nil {
		testenv.Unreachable(t, "RabbitMQ at "+redact(u), err)
	}
	conn.Close()
	if _, err := faultsStore(); err != nil {
		testenv.Unreachable(t, "PostgreSQL", err)
	}
	faults.Run(t, faults.Target{
		Name: "rabbit",
		Addr: u,
		Open: func(ctx context.Context, addr string) (driver.Backend, error) {
			st, err := faultsStore()
			if err != nil {
				return nil, err
			}
			return New(ctx, Config{URL: addr, Prefix: faultsPrefix, ReconnectMin: 20 * time.Millisecond,
				ReconnectMax: 500 * time.Millisecond, PublishTimeout: 10 * time.Second, Logger: faults.Logger(), Store: st})
		},
		HostPort: func(addr string) string {
			u, _ := url.Parse(addr)
			return u.Host
		},
		Via: func(addr, hostport string) string {
			u, _ := url.Parse(addr)
			u.Host = hostport
			return u.String()
		},
		Private: faults.SharedPrivate(t, privateRabbit),
		Garbage: func(ctx context.Context, addr, queue string, raw []byte) error {
			conn, err := amqp.Dial(addr)
			if err != nil {
				return err
			}
			defer conn.Close()
			ch, err := conn.Channel()
			if err != nil {
				return err
			}
			if err := ch.Confirm(false); err != nil {
				return err
			}
			c, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", faultsPrefix+"."+queue, true, false,
				amqp.Publishing{DeliveryMode: amqp.Persistent, Body: raw})
			if err != nil {
				return err
			}
			if ok, err := c.WaitContext(ctx); err != nil || !ok {
				return fmt.Errorf("garbage publish not confirmed: %v", err)
			}
			return nil
		},
	})
}

// rabbitServerEnv names the rabbitmq-server script for a node of the
// test's own; by default the one of Debian's package.
const rabbitServerEnv = "ASYNCPLATFORM_RABBITMQ_SERVER"

// privateRabbit runs a RabbitMQ node of the test's own: its own node name,
// AMQP and distribution ports, data, log and configuration in a temporary
// directory (HOME too, for its Erlang cookie), no plugins; it registers
// with the machine's epmd beside the shared node, which it never touches.
// The script execs the Erlang VM itself (RUNNING_UNDER_SYSTEMD), so the
// process the test holds is the node: SIGTERM stops it gracefully, SIGKILL
// kills it. It boots in 6 to 10 s here. Its directory and its stop belong
// to owner (t or a parent of t).
func privateRabbit(t, owner *testing.T) *faults.Broker {
	bin := os.Getenv(rabbitServerEnv)
	if bin == "" {
		bin = "/usr/lib/rabbitmq/bin/rabbitmq-server"
	}
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("no rabbitmq-server for a broker of the test's own (set %s): %v", rabbitServerEnv, err)
	}
	dir, port, dist := owner.TempDir(), faults.FreePort(t), faults.FreePort(t)
	hostport := fmt.Sprintf("127.0.0.1:%d", port)
	conf := filepath.Join(dir, "rabbitmq.conf")
	plugins := filepath.Join(dir, "enabled_plugins")
	envConf := filepath.Join(dir, "rabbitmq-env.conf")
	for path, text := range map[string]string{
		conf:    "listeners.tcp.default = " + hostport + "\n",
		plugins: "[].\n",
		envConf: "", // not the machine's /etc/rabbitmq/rabbitmq-env.conf
	} {
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	env := []string{
		"HOME=" + dir,
		"RUNNING_UNDER_SYSTEMD=true",
		"RABBITMQ_NODENAME=faults-" + strings.ToLower(rand.Text()) + "@localhost",
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT=" + fmt.Sprint(port),
		"RABBITMQ_DIST_PORT=" + fmt.Sprint(dist),
		"RABBITMQ_CONFIG_FILE=" + conf,
		"RABBITMQ_CONF_ENV_FILE=" + envConf,
		"RABBITMQ_ENABLED_PLUGINS_FILE=" + plugins,
		"RABBITMQ_MNESIA_BASE=" + filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE=" + filepath.Join(dir, "log"),
		"RABBITMQ_PID_FILE=" + filepath.Join(dir, "node.pid"),
		"ERL_EPMD_ADDRESS=127.0.0.1",
	}
	s := faults.StartServer(t, faults.ServerConfig{Bin: bin, Dir: dir, HostPort: hostport, Env: env, Boot: 90 * time.Second, Owner: owner})
	return &faults.Broker{Addr: "amqp://guest:guest@" + hostport + "/", Restart: s.Restart, KillAge: 2 * time.Second, KillLeaves: rabbitKillLeaves}
}

// rabbitKillLeaves is why RandomFaults restarts RabbitMQ gracefully only,
// and why BrokerKill waits until its queues are 2 s old (KillAge): RabbitMQ
// 3.10.8's ra saves the name of a new quorum queue's Raft server to disk
// only every 0.5 s, so a SIGKILL within ~0.8 s of a quorum queue's creation
// brings it back with a new, empty log and no leader: what was confirmed
// into it is lost and nothing is confirmed again (TestRabbitKillFact,
// "fresh"; fixed upstream in ra #443). An older queue recovers with every
// message ("registered"). The backend creates delay queues when a delay
// first needs them, which RandomFaults does at random moments.
const rabbitKillLeaves = "RabbitMQ 3.10.8 loses a quorum queue SIGKILLed within ~0.8 s of its creation (TestRabbitKillFact), " +
	"and the backend creates delay queues at their first use, at random moments here"
