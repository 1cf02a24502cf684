package azure

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform"
)

const crashWorkerEnv = "ASYNCPLATFORM_AZURE_CRASH_WORKER" // the queue to work

// crashWorker is the child process of TestKilledWorker: it works the queue,
// says "started <id>" when a handler runs, and blocks until it is killed.
func crashWorker() {
	b, err := New(context.Background(), Config{ConnectionString: os.Getenv(ConnectionStringEnv), ClientOptions: clientOptions()})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(2)
	}
	q := os.Getenv(crashWorkerEnv)
	p, err := asyncplatform.New(b, asyncplatform.Config{
		Queues: map[string]asyncplatform.QueueConfig{q: {Concurrency: 1, Prefetch: asyncplatform.Limit(0)}},
		Lease:  2 * time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err == nil {
		err = p.Handle("crash", func(ctx context.Context, j *asyncplatform.Job) error {
			fmt.Println("started", j.ID, j.TryCount)
			select {}
		})
	}
	if err == nil {
		err = p.Start(context.Background())
	}
	if err != nil {
		fmt.Println("error", err)
		os.Exit(2)
	}
	select {}
}

// TestKilledWorker kills a real worker process with SIGKILL mid-job: the job
// comes back to another worker with the crash counted, and nothing is lost.
func TestKilledWorker(t *testing.T) {
	t.Parallel()
	be, q := newBackend(t, Config{})
	ctx := context.Background()
	p, err := asyncplatform.New(be, asyncplatform.Config{
		Queues: map[string]asyncplatform.QueueConfig{q: {Concurrency: 1}},
		Lease:  2 * time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	job := &asyncplatform.Job{Type: "crash", Queue: q, Payload: []byte("victim")}
	if err := p.Enqueue(ctx, job); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashWorkerEnv+"="+q, ConnectionStringEnv+"="+connString)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "started "+job.ID+" 1") {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("child said %q, %v; want started %s 1", line, err, job.ID)
	}
	if err := cmd.Process.Kill(); err != nil { // SIGKILL mid-job
		t.Fatal(err)
	}
	_ = cmd.Wait()

	got := make(chan *asyncplatform.Job, 2)
	if err := p.Handle("crash", func(ctx context.Context, j *asyncplatform.Job) error {
		c := *j // the platform may write to *j once the handler returns
		got <- &c
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Stop(ctx)
	select {
	case j := <-got:
		if j.ID != job.ID || string(j.Payload) != "victim" || j.Crashes != 1 || j.TryCount != 2 || j.Failures != 0 {
			t.Fatalf("redelivered %s %q crashes %d tries %d failures %d; want %s victim 1 2 0", j.ID, j.Payload, j.Crashes, j.TryCount, j.Failures, job.ID)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the killed worker's job did not come back")
	}
	if err := p.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := be.Stats(ctx, q)
	if err != nil || st.Ready != 0 || st.Dead != 0 {
		t.Fatalf("after: stats %+v %v; want nothing ready or dead", st, err)
	}
}
