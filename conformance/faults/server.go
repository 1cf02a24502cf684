package faults

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/internal/childproc"
)

// Server is a broker process of a test's own on a fixed loopback port: a
// Target's Private broker, or a broker fact test's.
type Server struct {
	cfg  ServerConfig
	cmd  *exec.Cmd
	done chan struct{}
}

// ServerConfig describes a Server.
type ServerConfig struct {
	// Bin is the server's executable and Args its arguments.
	Bin  string
	Args []string

	// Dir is the server's working directory; its output goes to
	// server.log there.
	Dir string

	// HostPort is the loopback address the server listens on: a start
	// returns once it accepts connections there.
	HostPort string

	// Env is added to the test process's environment for the server.
	Env []string

	// Boot is how long a start may take to listen. Defaults to 30s.
	Boot time.Duration

	// Owner is the test whose end stops the server: the test StartServer
	// is given, or a parent of it (a server shared by subtests). Defaults
	// to the test StartServer is given.
	Owner *testing.T
}

// StartServer starts the server and waits until it listens; the test fails
// when it does not. The server is killed when cfg.Owner (or t) ends.
func StartServer(t *testing.T, cfg ServerConfig) *Server {
	t.Helper()
	if cfg.Boot == 0 {
		cfg.Boot = 30 * time.Second
	}
	owner := cfg.Owner
	if owner == nil {
		owner = t
	}
	s := &Server{cfg: cfg}
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
	owner.Cleanup(func() {
		_ = s.cmd.Process.Kill()
		<-s.done
	})
	return s
}

func (s *Server) start() error {
	cmd := exec.Command(s.cfg.Bin, s.cfg.Args...)
	cmd.Dir = s.cfg.Dir
	childproc.DieWithParent(cmd)
	cmd.Env = append(os.Environ(), s.cfg.Env...)
	log, err := os.OpenFile(filepath.Join(s.cfg.Dir, "server.log"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
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
	deadline := time.Now().Add(s.cfg.Boot)
	for {
		c, err := net.DialTimeout("tcp", s.cfg.HostPort, time.Second)
		if err == nil {
			self := selfConnected(c)
			c.Close()
			if !self {
				return nil
			}
			err = fmt.Errorf("dial to %s connected to itself", s.cfg.HostPort)
		}
		select {
		case <-done:
			b, _ := os.ReadFile(filepath.Join(s.cfg.Dir, "server.log"))
			return fmt.Errorf("%s exited at start-up: %s", s.cfg.Bin, b)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not listening on %s after %v: %w", s.cfg.Bin, s.cfg.HostPort, s.cfg.Boot, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Restart stops the server (SIGKILL when kill, else SIGTERM), waits for it,
// and starts it again on the same port with the same data. It is what a
// Broker's Restart usually is.
func (s *Server) Restart(kill bool) error {
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

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// SharedPrivate makes a Target.Private that starts one broker of the
// backend's own on first use, for every scenario of the backend (they run
// one after another, each on queues of its own), and stops it when owner,
// the test that calls Run, ends: a broker that takes seconds to boot boots
// once. start gets the scenario's test and owner.
func SharedPrivate(owner *testing.T, start func(t, owner *testing.T) *Broker) func(*testing.T) *Broker {
	var (
		mu sync.Mutex
		b  *Broker
	)
	return func(t *testing.T) *Broker {
		mu.Lock()
		defer mu.Unlock()
		if b == nil {
			b = start(t, owner)
		}
		return b
	}
}

// Logger is the logger for a Target's backends and the scenarios'
// platforms: warnings and errors go to stderr only when
// ASYNCPLATFORM_FAULTS_VERBOSE is set, and nowhere otherwise.
func Logger() *slog.Logger { return quiet() }

// selfConnected reports whether c is connected to itself: a dial to a free
// loopback port of the ephemeral range can pick that port as its own and
// connect by TCP simultaneous open, with no server there.
func selfConnected(c net.Conn) bool {
	return c.LocalAddr().String() == c.RemoteAddr().String()
}
