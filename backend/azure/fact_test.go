package azure

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azqueue"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azqueue/queueerror"

	"github.com/asyncplatform/asyncplatform/conformance/faults"
	"github.com/asyncplatform/asyncplatform/internal/testenv"
)

// TestAzuriteDoubleDequeueFact records, with the azqueue SDK alone (no
// platform code), whether Azurite hands one message to two concurrent
// receivers: 400 messages, then 16 goroutines each dequeuing one message at
// a time with a 60 s visibility timeout until the queue is empty. Azure
// Queue Storage makes a dequeued message invisible at once, so each message
// should be received once, with DequeueCount 1. A message received twice
// within its visibility timeout carries the same DequeueCount both times,
// and the backend, which counts crashes from DequeueCount, cannot tell the
// second receiver that the first ran it: what the soak's Azure PoisonJob
// and RandomFaults showed as uncounted crashes (evidence:
// docs/reliability.md, "Azure (Azurite 3.37): one message handed to two
// concurrent receivers"). It fails only if a message is never received.
func TestAzuriteDoubleDequeueFact(t *testing.T) {
	b := privateAzurite(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	svc, err := azqueue.NewServiceClientFromConnectionString(b.Addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	q := svc.NewQueueClient("doubledequeue")
	if _, err := q.Create(ctx, nil); err != nil {
		t.Fatal(err)
	}
	const n, receivers = 400, 16
	for i := range n {
		if _, err := q.EnqueueMessage(ctx, fmt.Sprint(i), nil); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	got := map[string][]int64{} // message ID: DequeueCount of each receipt
	var wg sync.WaitGroup
	for range receivers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			one, vis := int32(1), int32(60)
			for empty := 0; empty < 3 && ctx.Err() == nil; {
				resp, err := q.DequeueMessages(ctx, &azqueue.DequeueMessagesOptions{NumberOfMessages: &one, VisibilityTimeout: &vis})
				if err != nil {
					t.Error(err)
					return
				}
				if len(resp.Messages) == 0 {
					empty++
					time.Sleep(50 * time.Millisecond)
					continue
				}
				for _, m := range resp.Messages {
					mu.Lock()
					got[*m.MessageID] = append(got[*m.MessageID], *m.DequeueCount)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	var twice []string
	for id, counts := range got {
		if len(counts) > 1 {
			twice = append(twice, fmt.Sprintf("%s:%v", id[:8], counts))
		}
	}
	t.Logf("Azurite: %d messages, %d receivers: %d received, %d of them more than once within the visibility timeout %v",
		n, receivers, len(got), len(twice), twice)
	if len(got) != n {
		t.Errorf("%d of %d messages received", len(got), n)
	}
}

// TestAzuriteDequeueCostFact records, with the azqueue SDK alone, how
// Azurite's dequeue cost grows with the messages stored in the account, in
// any queue: Azurite 3.37 (LokiQueueMetadataStore.getMessages, and
// clearExpiredMessages before it) finds a queue's messages through its
// index on the account name, so every dequeue walks every message of the
// account, then sorts the queue's visible ones. It times the median
// one-message dequeue of a queue holding 1,000 messages, alone in the
// account, then with 10,000 more messages in another queue (what 10,000
// dead letters were in the queue-per-record layout), then with its own
// queue 10,000 deep. Azure Queue Storage has no such cost. It fails only on
// errors. Soak mode only: it takes half a minute.
func TestAzuriteDequeueCostFact(t *testing.T) {
	if faults.Soak() == 0 {
		t.Skipf("soak mode only (set %s): it fills an Azurite of its own with 21,000 messages", faults.SoakEnv)
	}
	b := privateAzurite(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	svc, err := azqueue.NewServiceClientFromConnectionString(b.Addr, &azqueue.ClientOptions{ClientOptions: clientOptions().ClientOptions})
	if err != nil {
		t.Fatal(err)
	}
	fill := func(name string, n int) *azqueue.QueueClient {
		q := svc.NewQueueClient(name)
		if _, err := q.Create(ctx, nil); err != nil && !queueerror.HasCode(err, queueerror.QueueAlreadyExists) {
			t.Fatal(err)
		}
		text := base64.StdEncoding.EncodeToString(make([]byte, 100))
		parallel(t, 16, n, func() error {
			_, err := q.EnqueueMessage(ctx, text, &azqueue.EnqueueMessageOptions{TimeToLive: to.Ptr(int32(-1))})
			return err
		})
		return q
	}
	dequeue := func(q *azqueue.QueueClient) time.Duration {
		var ds []time.Duration
		for range 25 {
			t0 := time.Now()
			resp, err := q.DequeueMessages(ctx, &azqueue.DequeueMessagesOptions{NumberOfMessages: to.Ptr(int32(1)), VisibilityTimeout: to.Ptr(int32(600))})
			ds = append(ds, time.Since(t0))
			if err != nil || len(resp.Messages) != 1 {
				t.Fatalf("dequeue: %v", err)
			}
		}
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	work := fill("work", 1000)
	alone := dequeue(work)
	fill("other", 10000)
	beside := dequeue(work)
	fill("work", 9000)
	deep := dequeue(work)
	t.Logf("Azurite: one-message dequeue of a queue of 1,000: %v alone in the account, %v with 10,000 messages in another queue; of a queue of 10,000: %v (with the other 10,000)",
		alone, beside, deep)
}

// TestAzuriteQueueGCStallFact records, with the azqueue SDK alone, that
// Azurite 3.37's queue service stops answering while its extent garbage
// collector runs (QueueGCManager, every 60 s): a mark and sweep after
// messages were deleted from a queue 10,000 deep blocks its event loop for
// tens of seconds (32 s here, with 1,007 unreferenced extents; a service
// properties request waited 32.7 s), and a claim with a 30 s deadline fails
// with context deadline exceeded, as the benchmark's Azure depth row at
// 1,000 waiting jobs did after dead-lettering. It logs the requests that
// took over a second and Azurite's own GC lines (--debug), and fails only
// on errors. Soak mode only: it takes about three minutes.
func TestAzuriteQueueGCStallFact(t *testing.T) {
	if faults.Soak() == 0 {
		t.Skipf("soak mode only (set %s): it takes about three minutes", faults.SoakEnv)
	}
	bin, err := filepath.Abs(azuriteBin)
	if err == nil {
		_, err = os.Stat(bin)
	}
	if err != nil {
		testenv.Unreachable(t, "Azurite (run scripts/azurite.sh install)", err)
	}
	port, _ := freePort()
	blobPort, _ := freePort()
	dir := t.TempDir()
	logf := filepath.Join(dir, "debug.log")
	cmd := exec.Command(bin, append(azuriteArgs(port, blobPort), "--inMemoryPersistence", "--debug", logf)...)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Env = append(os.Environ(), "AZURITE_ACCOUNTS="+devAccount+":"+devKey)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	for deadline := time.Now().Add(time.Minute); !dialOK(addr); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("Azurite did not listen within a minute")
		}
	}
	start := time.Now()
	svc, err := azqueue.NewServiceClientFromConnectionString(azuriteConnString(addr, fmt.Sprintf("127.0.0.1:%d", blobPort)), &azqueue.ClientOptions{ClientOptions: clientOptions().ClientOptions})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	q := svc.NewQueueClient("gcstall")
	if _, err := q.Create(ctx, nil); err != nil {
		t.Fatal(err)
	}
	text := base64.StdEncoding.EncodeToString(make([]byte, 300))
	parallel(t, 16, 10000, func() error {
		_, err := q.EnqueueMessage(ctx, text, &azqueue.EnqueueMessageOptions{TimeToLive: to.Ptr(int32(-1))})
		return err
	})
	t.Logf("10,000 enqueued at %v", time.Since(start).Round(time.Second))
	// Ping throughout; delete messages for 90 s, then wait 60 s more.
	stop := make(chan struct{})
	var pmu sync.Mutex
	type slow struct{ at, d time.Duration }
	var slows []slow
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			t0 := time.Now()
			_, err := svc.GetServiceProperties(ctx, nil)
			d := time.Since(t0)
			if err != nil || d > time.Second {
				pmu.Lock()
				slows = append(slows, slow{t0.Sub(start), d})
				pmu.Unlock()
			}
			time.Sleep(200 * time.Millisecond)
		}
	}()
	var mu sync.Mutex
	deleted := 0
	dctx, dcancel := context.WithTimeout(ctx, 90*time.Second)
	parallel(t, 16, 16, func() error {
		for dctx.Err() == nil {
			resp, err := q.DequeueMessages(dctx, &azqueue.DequeueMessagesOptions{NumberOfMessages: to.Ptr(int32(32)), VisibilityTimeout: to.Ptr(int32(300))})
			if err != nil {
				return nil
			}
			for _, m := range resp.Messages {
				if _, err := q.DeleteMessage(dctx, *m.MessageID, *m.PopReceipt, nil); err == nil {
					mu.Lock()
					deleted++
					mu.Unlock()
				}
			}
		}
		return nil
	})
	dcancel()
	t.Logf("%d deleted by %v", deleted, time.Since(start).Round(time.Second))
	time.Sleep(60 * time.Second)
	close(stop)
	pmu.Lock()
	for _, s := range slows {
		t.Logf("ping at %v took %v", s.at.Round(time.Second), s.d.Round(time.Millisecond))
	}
	pmu.Unlock()
	b, _ := os.ReadFile(logf)
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "Mark and sweep finished") || strings.Contains(l, "unreferenced extents count") {
			t.Log(strings.TrimSpace(l[:min(len(l), 200)]))
		}
	}
}
