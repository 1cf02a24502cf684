package rabbit

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/asyncplatform/asyncplatform"
)

// The child process of TestWorkerKilled runs this test function: a platform
// whose handler says "running <id>" and then hangs.
const killChildEnv = "ASYNCPLATFORM_RABBIT_KILL_CHILD_QUEUE"

func TestKillChildWorker(t *testing.T) {
	q := os.Getenv(killChildEnv)
	if q == "" {
		t.Skip("the child process of TestWorkerKilled")
	}
	quiet := slog.New(slog.DiscardHandler)
	b, err := New(context.Background(), Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	p, err := asyncplatform.New(b, asyncplatform.Config{Queues: map[string]asyncplatform.QueueConfig{q: {Concurrency: 1}}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	p.Handle("kill", func(ctx context.Context, j *asyncplatform.Job) error {
		fmt.Printf("running %s try=%d\n", j.ID, j.TryCount)
		select {}
	})
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {}
}

// TestWorkerKilled kills a real worker process with SIGKILL mid-job: the job
// comes back at once with the crash counted, and nothing is lost.
func TestWorkerKilled(t *testing.T) {
	t.Parallel()
	quiet := slog.New(slog.DiscardHandler)
	b := newBackend(t, Config{Logger: quiet})
	q := queueName(t, b)
	ctx := testCtx(t)
	p, err := asyncplatform.New(b, asyncplatform.Config{Queues: map[string]asyncplatform.QueueConfig{q: {Concurrency: 1}}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Enqueue(ctx, &asyncplatform.Job{ID: "victim", Type: "kill", Queue: q, Payload: []byte("p")}); err != nil {
		t.Fatal(err)
	}

	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestKillChildWorker$", "-test.v")
	cmd.Env = append(os.Environ(), killChildEnv+"="+q, URLEnv+"="+testURL())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "running victim try=1") {
			break
		}
	}
	if err := cmd.Process.Kill(); err != nil { // SIGKILL
		t.Fatal(err)
	}
	go func() {
		for sc.Scan() {
		}
	}()
	cmd.Wait()

	got := make(chan *asyncplatform.Job, 1)
	p.Handle("kill", func(ctx context.Context, j *asyncplatform.Job) error {
		got <- j
		return nil
	})
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Stop(context.Background())
	select {
	case j := <-got:
		if j.ID != "victim" || j.Crashes != 1 || j.TryCount != 2 || string(j.Payload) != "p" {
			t.Fatalf("after the kill: ID %s Crashes %d TryCount %d payload %q, want victim 1 2 p", j.ID, j.Crashes, j.TryCount, j.Payload)
		}
	case <-ctx.Done():
		t.Fatal("the killed worker's job never came back")
	}
}
