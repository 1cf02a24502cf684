package azure

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"slices"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azqueue"

	"github.com/asyncplatform/asyncplatform/internal/queuetest"
	"github.com/asyncplatform/asyncplatform/internal/testenv"
)

// TestQueues lists the queues of a prefix of the test's own on Azurite:
// readable names from their work queues' names, hashed ones (the scenario's
// Jobs_x.y-Z and its 100-byte name) from their labels, and never a label
// that does not hash to its queue.
func TestQueues(t *testing.T) {
	t.Parallel()
	needAzurite(t)
	var r [4]byte
	_, _ = rand.Read(r[:])
	cfg := testConfig(t, Config{Prefix: "q" + hex.EncodeToString(r[:])[:7]})
	b, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.Ping(context.Background()); err != nil {
		testenv.Unreachable(t, "Azurite", err)
	}
	queuetest.Run(t, b, queuetest.Options{Lease: 2 * b.Capabilities().MinLease})

	// A forged label: a hashed work queue whose label names another queue.
	ctx := context.Background()
	forged := b.names("Other.Queue").work
	if _, err := b.svc.CreateQueue(ctx, forged, &azqueue.CreateOptions{Metadata: map[string]*string{nameMeta: new(queuetest.Jobs)}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = b.svc.DeleteQueue(context.Background(), forged, nil) })
	got, err := b.Queues(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{queuetest.Jobs}; !slices.Equal(got, want) {
		t.Fatalf("Queues = %q, want %q", got, want)
	}
	if err := b.DeleteQueue(ctx, queuetest.Jobs); err != nil {
		t.Fatal(err)
	}
}
