//go:build unix

package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/asyncplatform/asyncplatform/internal/testenv"
)

// Server is a PostgreSQL server of a test's own. Its methods are not safe
// for concurrent use.
type Server struct {
	// URL connects to the database postgres as the superuser postgres.
	URL string

	dir, data, bin string
	port           int
	cred           *syscall.Credential
	cmd            *exec.Cmd
	done           chan struct{}
	log            *os.File
}

// Start makes a cluster in a temporary directory and starts its server;
// the test fails when it cannot, and is skipped (failed when
// ASYNCPLATFORM_REQUIRE_SERVERS is set) when PostgreSQL is not installed.
// The server is killed and its directory removed when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := findBin()
	if err != nil {
		testenv.Unreachable(t, "a PostgreSQL of the test's own", err)
	}
	cred, err := credential()
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	dir, err := os.MkdirTemp("", "pgtest-")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{dir: dir, data: filepath.Join(dir, "data"), bin: bin, cred: cred}
	t.Cleanup(func() {
		s.stop(syscall.SIGKILL)
		if s.log != nil {
			s.log.Close()
		}
		if err := os.RemoveAll(dir); err != nil {
			t.Logf("pgtest: removing %s: %v", dir, err)
		}
	})
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			t.Fatalf("pgtest: giving %s to the server's user: %v", dir, err)
		}
	}
	if s.log, err = os.Create(filepath.Join(dir, "server.log")); err != nil {
		t.Fatal(err)
	}
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", s.data, "-U", "postgres",
		"-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")
	initdb.Dir = dir
	initdb.Stdout, initdb.Stderr = s.log, s.log
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if err := initdb.Run(); err != nil {
		t.Fatalf("pgtest: initdb: %v\n%s", err, s.output())
	}
	for try := 0; ; try++ { // the free port may be taken before we listen
		s.port = freePort(t)
		s.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
		err = s.start()
		if err == nil || try == 3 {
			break
		}
	}
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return s
}

// Restart stops the server and starts it again on the same port and data,
// returning once it answers queries. With kill, every process of the server
// gets SIGKILL at once, as in a crash: the start then recovers from the
// write-ahead log. Otherwise it is a fast shutdown (SIGINT: the clients are
// disconnected, everything written to disk).
func (s *Server) Restart(kill bool) error {
	sig := syscall.SIGINT
	if kill {
		sig = syscall.SIGKILL
	}
	if err := s.stop(sig); err != nil {
		return err
	}
	var err error
	for range 20 { // a server process of the old one may linger a moment
		if err = s.start(); err == nil || !errors.Is(err, errExited) {
			return err
		}
		time.Sleep(250 * time.Millisecond)
	}
	return err
}

// errExited is the error of a start whose postmaster exited at once.
var errExited = errors.New("postgres exited at start-up")

// stop ends the server, with SIGKILL to each of its processes (crash) or
// with sig to the postmaster, and waits for it.
func (s *Server) stop(sig syscall.Signal) error {
	if s.cmd == nil {
		return nil
	}
	defer func() { s.cmd = nil }()
	pid := s.cmd.Process.Pid
	if sig == syscall.SIGKILL {
		crash(pid, Boot)
	} else {
		_ = syscall.Kill(pid, sig)
	}
	select {
	case <-s.done:
		return nil
	case <-time.After(Boot):
		crash(pid, Boot)
		<-s.done
		return fmt.Errorf("pgtest: the server did not stop on %v within %v", sig, Boot)
	}
}

// start runs the postmaster and waits until it answers a query.
func (s *Server) start() error {
	cmd := exec.Command(filepath.Join(s.bin, "postgres"), "-D", s.data,
		"-p", strconv.Itoa(s.port), "-k", s.dir,
		"-c", "listen_addresses=127.0.0.1",
		"-c", "shared_buffers=16MB", "-c", "max_connections=100",
		"-c", "fsync=on", "-c", "synchronous_commit=on")
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = s.log, s.log
	cmd.SysProcAttr = procAttr(s.cred)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting postgres: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	s.cmd, s.done = cmd, done
	ctx, cancel := context.WithTimeout(context.Background(), Boot)
	defer cancel()
	for {
		err := ping(ctx, s.URL)
		if err == nil {
			return nil
		}
		select {
		case <-done:
			s.cmd = nil
			return fmt.Errorf("%w: %s", errExited, s.output())
		case <-ctx.Done():
			_ = s.stop(syscall.SIGKILL)
			return fmt.Errorf("postgres did not answer within %v: %w\n%s", Boot, err, s.output())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// output is the end of the server's log, for an error.
func (s *Server) output() string {
	b, _ := os.ReadFile(s.log.Name())
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

func ping(ctx context.Context, url string) error {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(cctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	var one int
	return conn.QueryRow(cctx, "SELECT 1").Scan(&one)
}

// findBin returns the directory of initdb and postgres.
func findBin() (string, error) {
	var dirs []string
	if d := os.Getenv(BinEnv); d != "" {
		dirs = append(dirs, d)
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			dirs = append(dirs, filepath.Dir(real))
		}
	}
	installed, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(installed, func(a, b string) int { // newest major version first
		va, _ := strconv.Atoi(filepath.Base(filepath.Dir(a)))
		vb, _ := strconv.Atoi(filepath.Base(filepath.Dir(b)))
		return vb - va
	})
	dirs = append(dirs, installed...)
	for _, d := range dirs {
		if isExec(filepath.Join(d, "initdb")) && isExec(filepath.Join(d, "postgres")) {
			return d, nil
		}
	}
	return "", errors.New("no initdb and postgres found (set " + BinEnv + ", or install the postgresql package)")
}

func isExec(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

// credential is the user the server runs as: nil (the test's own) unless
// the test runs as root.
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	name := testenv.Getenv(UserEnv, "postgres")
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL will not run as root, and the user %q to run it as: %w (set %s)", name, err, UserEnv)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user %q: uid %q: %w", name, u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user %q: gid %q: %w", name, u.Gid, err)
	}
	if uid == 0 {
		return nil, fmt.Errorf("the user %q is root: PostgreSQL will not run as root (set %s)", name, UserEnv)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}, nil
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
