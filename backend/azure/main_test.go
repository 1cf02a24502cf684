package azure

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azqueue"

	"github.com/asyncplatform/asyncplatform/internal/testenv"
)

// devAccount is Azurite's public, well-known development account.
const (
	devAccount = "devstoreaccount1"
	devKey     = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)

var (
	connString string // set by TestMain when a server is available
	connErr    error  // why it is not
)

func TestMain(m *testing.M) {
	if os.Getenv(crashWorkerEnv) != "" {
		crashWorker() // never returns
	}
	stop := setupAzurite()
	code := m.Run()
	stop()
	os.Exit(code)
}

// setupAzurite points the tests at the Azurite (or Azure account) of
// $ASYNCPLATFORM_AZURE_CONNECTION_STRING (ConnectionStringEnv), or, when it
// is unset, starts Azurite from .tools/azurite (scripts/azurite.sh install)
// on a free loopback port; stop stops it.
func setupAzurite() (stop func()) {
	if cs := os.Getenv(ConnectionStringEnv); cs != "" {
		connString = cs
		return func() {}
	}
	bin, err := filepath.Abs(azuriteBin)
	if err == nil {
		_, err = os.Stat(bin)
	}
	if err != nil {
		connErr = fmt.Errorf("%s is unset and Azurite is not installed (run scripts/azurite.sh install): %w", ConnectionStringEnv, err)
		return func() {}
	}
	port, err := freePort()
	if err != nil {
		connErr = err
		return func() {}
	}
	blobPort, err := freePort()
	if err != nil {
		connErr = err
		return func() {}
	}
	dir, err := os.MkdirTemp("", "azurite-")
	if err != nil {
		connErr = err
		return func() {}
	}
	log, err := os.Create(filepath.Join(dir, "azurite.log"))
	if err != nil {
		connErr = err
		return func() {}
	}
	cmd := exec.Command(bin, append(azuriteArgs(port, blobPort), "--inMemoryPersistence")...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "AZURITE_ACCOUNTS="+devAccount+":"+devKey)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		connErr = fmt.Errorf("start Azurite: %w", err)
		return func() {}
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	stop = func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		log.Close()
		os.RemoveAll(dir)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	blobAddr := fmt.Sprintf("127.0.0.1:%d", blobPort)
	for deadline := time.Now().Add(60 * time.Second); ; {
		if dialOK(addr) && dialOK(blobAddr) {
			break
		}
		select {
		case <-done:
			out, _ := os.ReadFile(log.Name())
			stop()
			connErr = fmt.Errorf("Azurite exited at start-up: %s", out)
			return func() {}
		default:
		}
		if time.Now().After(deadline) {
			stop()
			connErr = fmt.Errorf("Azurite did not listen on %s and %s within 60s", addr, blobAddr)
			return func() {}
		}
		time.Sleep(50 * time.Millisecond)
	}
	connString = azuriteConnString(addr, blobAddr)
	// Child processes (the crash tests' workers) use the same instance.
	os.Setenv(ConnectionStringEnv, connString)
	return stop
}

// azuriteBin is Azurite's command for all its services, installed by
// scripts/azurite.sh install (relative to this package's folder).
const azuriteBin = "../../.tools/azurite/node_modules/.bin/azurite"

// azuriteArgs are the arguments of an Azurite serving the queue and blob
// services on loopback (the table service, unused, on a port of the
// system's choosing).
func azuriteArgs(queuePort, blobPort int) []string {
	return []string{"--queueHost", "127.0.0.1", "--queuePort", fmt.Sprint(queuePort),
		"--blobHost", "127.0.0.1", "--blobPort", fmt.Sprint(blobPort),
		"--tableHost", "127.0.0.1", "--tablePort", "0",
		"--disableTelemetry", "--skipApiVersionCheck", "--loose", "--silent"}
}

// azuriteConnString is the connection string of the development account on
// an Azurite with the queue and blob services at these addresses.
func azuriteConnString(queueAddr, blobAddr string) string {
	return fmt.Sprintf("DefaultEndpointsProtocol=http;AccountName=%s;AccountKey=%s;QueueEndpoint=http://%s/%s;BlobEndpoint=http://%s/%s;",
		devAccount, devKey, queueAddr, devAccount, blobAddr, devAccount)
}

func dialOK(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// clientOptions give the SDK a transport that drops idle connections before
// Azurite's server does (after 5s), so no request meets a connection being
// closed. See Config.ClientOptions.
func clientOptions() *azqueue.ClientOptions {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.IdleConnTimeout = 2 * time.Second
	tr.MaxIdleConnsPerHost = 64
	return &azqueue.ClientOptions{ClientOptions: azcore.ClientOptions{Transport: &http.Client{Transport: tr}}}
}

// testConfig is cfg pointed at the test server.
func testConfig(t testing.TB, cfg Config) Config {
	cfg.ConnectionString = needAzurite(t)
	cfg.ClientOptions = clientOptions()
	return cfg
}

// needAzurite returns the connection string, or skips (fails under CI).
func needAzurite(t testing.TB) string {
	t.Helper()
	if connString == "" {
		testenv.Unreachable(t, "Azurite", connErr)
	}
	return connString
}

var nonName = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// queueName derives a fresh facade queue name from the test's name.
func queueName(t testing.TB) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := nonName.ReplaceAllString(t.Name(), "_")
	if len(name) > 60 {
		name = name[len(name)-60:]
	}
	return name + "." + hex.EncodeToString(b[:])
}

// newBackend opens a backend and a fresh queue removed after the test.
func newBackend(t testing.TB, cfg Config) (*Backend, string) {
	t.Helper()
	cfg = testConfig(t, cfg)
	b, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := b.Ping(ctx); err != nil {
		testenv.Unreachable(t, "Azurite", err)
	}
	q := queueName(t)
	if err := b.Declare(ctx, q); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		b.Close()
		c, err := New(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := c.DeleteQueue(context.Background(), q); err != nil {
			t.Errorf("delete queue: %v", err)
		}
	})
	return b, q
}
