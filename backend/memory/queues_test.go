package memory_test

import (
	"context"
	"testing"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/internal/queuetest"
)

func TestQueues(t *testing.T) {
	t.Parallel()
	b, err := memory.New(context.Background(), memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	queuetest.Run(t, b, queuetest.Options{})
}
