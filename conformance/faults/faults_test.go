package faults

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azqueue"

	"github.com/asyncplatform/asyncplatform/backend/azure"
	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/testenv"
)

// TestFaults runs every scenario on every backend, the backends in parallel.
func TestFaults(t *testing.T) {
	for _, tc := range []struct {
		name   string
		target func(t *testing.T) Target
	}{
		{"memory", memoryTarget},
		{"azure", azureTarget},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if os.Getenv(childEnv) == "" {
				t.Parallel()
			}
			Run(t, tc.target(t))
		})
	}
}

// ---- memory ----

var memBroker = memory.NewBroker()

func memoryTarget(*testing.T) Target {
	return Target{
		Name:      "memory",
		Lease:     500 * time.Millisecond,
		InProcess: "the memory broker lives in the test process: workers are goroutines, a crash is a closed connection",
		Open: func(context.Context, string) (driver.Backend, error) {
			return memBroker.Connect(), nil
		},
		Garbage: func(ctx context.Context, _, queue string, raw []byte) error {
			b := memBroker.Connect() // the driver is the memory broker's own client
			defer b.Close()
			return b.Enqueue(ctx, queue, []driver.Message{{ID: "garbage", Body: raw}})
		},
	}
}

// ---- Azure (Azurite) ----

func azureTarget(t *testing.T) Target {
	cs := os.Getenv(azureEnv)
	if cs == "" && os.Getenv(childEnv) == "" { // a child is told its address
		b := privateAzurite(t, false)
		cs = b.Addr
	}
	return Target{
		Name: "azure",
		Addr: cs,
		Open: func(ctx context.Context, addr string) (driver.Backend, error) {
			return azure.New(azure.Config{ConnectionString: addr, Prefix: "fl", DeadLease: 2 * time.Second,
				PollInterval: 50 * time.Millisecond, Logger: quiet()})
		},
		HostPort: func(addr string) string { return endpoint.FindStringSubmatch(addr)[1] },
		Via: func(addr, hostport string) string {
			return endpoint.ReplaceAllString(addr, "QueueEndpoint=http://"+hostport+"/")
		},
		Private: func(t *testing.T) *Broker { return privateAzurite(t, true) },
		Garbage: func(ctx context.Context, addr, queue string, raw []byte) error {
			svc, err := azqueue.NewServiceClientFromConnectionString(addr, nil)
			if err != nil {
				return err
			}
			// The work queue of a lower-case queue name of at most 34 characters.
			_, err = svc.NewQueueClient("flw"+queue).EnqueueMessage(ctx, base64.StdEncoding.EncodeToString(raw), nil)
			return err
		},
	}
}

// azureEnv points the tests at a running Azurite (scripts/azurite.sh start);
// when it is unset the test starts an Azurite of its own.
const azureEnv = "ASYNCPLATFORM_AZURE_CONNECTION_STRING"

var endpoint = regexp.MustCompile(`QueueEndpoint=http://([^/;]+)/`)

const (
	azuriteAccount = "devstoreaccount1"
	azuriteKey     = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)

// privateAzurite runs an Azurite of the test's own from .tools/azurite
// (scripts/azurite.sh install). With disk true it keeps its data in a
// directory, and Restart stops it with SIGTERM (Azurite writes its data to
// disk every few seconds and on shutdown: a SIGKILL would test Azurite, not
// us).
func privateAzurite(t *testing.T, disk bool) *Broker {
	bin, err := filepath.Abs("../../.tools/azurite/node_modules/.bin/azurite-queue")
	if err == nil {
		_, err = os.Stat(bin)
	}
	if err != nil {
		testenv.Unreachable(t, "Azurite (run scripts/azurite.sh install, or set "+azureEnv+")", err)
	}
	dir, port := t.TempDir(), freePort(t)
	args := []string{"--queueHost", "127.0.0.1", "--queuePort", fmt.Sprint(port), "--disableTelemetry",
		"--skipApiVersionCheck", "--loose", "--silent"}
	if disk {
		args = append(args, "--location", dir)
	} else {
		args = append(args, "--inMemoryPersistence")
	}
	hostport := fmt.Sprintf("127.0.0.1:%d", port)
	p := startServer(t, bin, args, dir, hostport, "AZURITE_ACCOUNTS="+azuriteAccount+":"+azuriteKey)
	cs := fmt.Sprintf("DefaultEndpointsProtocol=http;AccountName=%s;AccountKey=%s;QueueEndpoint=http://%s/%s;",
		azuriteAccount, azuriteKey, hostport, azuriteAccount)
	return &Broker{Addr: cs, Restart: p.restart,
		NoKill: "Azurite persists to disk every few seconds, so a SIGKILL tests Azurite, not the backend"}
}

// ---- servers of the test's own ----

// server is a broker process of the test's own, on a fixed loopback port.
type server struct {
	t        *testing.T
	bin      string
	args     []string
	dir      string
	hostport string
	env      []string
	boot     time.Duration // how long a start may take to listen; 30s when zero
	cmd      *exec.Cmd
	done     chan struct{}
}

func startServer(t *testing.T, bin string, args []string, dir, hostport string, env ...string) *server {
	return startServerBoot(t, t, 0, bin, args, dir, hostport, env...)
}

// startServerBoot is startServer for a server that may take up to boot to
// listen, and that is stopped when owner (t or a parent of t) ends.
func startServerBoot(t, owner *testing.T, boot time.Duration, bin string, args []string, dir, hostport string, env ...string) *server {
	if boot == 0 {
		boot = 30 * time.Second
	}
	s := &server{t: t, bin: bin, args: args, dir: dir, hostport: hostport, env: env, boot: boot}
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
	owner.Cleanup(func() {
		_ = s.cmd.Process.Kill()
		<-s.done
	})
	return s
}

func (s *server) start() error {
	cmd := exec.Command(s.bin, s.args...)
	cmd.Dir = s.dir
	dieWithParent(cmd)
	cmd.Env = append(os.Environ(), s.env...)
	log, err := os.OpenFile(filepath.Join(s.dir, "server.log"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		return err
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		log.Close()
		close(done)
	}()
	s.cmd, s.done = cmd, done
	deadline := time.Now().Add(s.boot)
	for {
		c, err := net.DialTimeout("tcp", s.hostport, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-done:
			b, _ := os.ReadFile(filepath.Join(s.dir, "server.log"))
			return fmt.Errorf("%s exited at start-up: %s", s.bin, b)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not listening on %s after %v: %w", s.bin, s.hostport, s.boot, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// restart stops the server (SIGKILL when kill, else SIGTERM), waits for it,
// and starts it again on the same port with the same data.
func (s *server) restart(kill bool) error {
	sig := syscall.SIGTERM
	if kill {
		sig = syscall.SIGKILL
	}
	_ = s.cmd.Process.Signal(sig)
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	var err error
	for range 20 { // the port may linger a moment
		if err = s.start(); err == nil || !strings.Contains(err.Error(), "exited") {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
	return err
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func randHex() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
