package asyncplatform_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"strconv"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/memory"
)

// The platform's Store is shared state every worker process sees at once:
// here a lock (Create with a TTL: one process wins, the lock frees itself if
// its holder dies) and a counter (read, add, Update at the revision read,
// again on ErrRevision).
func ExamplePlatform_Store() {
	ctx := context.Background()
	backend, err := memory.New(ctx, memory.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer backend.Close()
	p, err := ap.New(backend, ap.Config{})
	if err != nil {
		log.Fatal(err)
	}
	st, err := p.Store()
	if err != nil {
		log.Fatal(err)
	}

	// A lock: the first Create wins, a second one finds it taken.
	lock, err := st.Create(ctx, "locks/nightly-report", []byte("worker-1"), 30*time.Second)
	fmt.Println("worker-1 takes the lock:", err == nil)
	_, err = st.Create(ctx, "locks/nightly-report", []byte("worker-2"), 30*time.Second)
	fmt.Println("worker-2 takes the lock:", !errors.Is(err, ap.ErrKeyExists))
	// Its holder releases it, at the revision it holds.
	if err := st.Delete(ctx, "locks/nightly-report", lock); err != nil {
		log.Fatal(err)
	}

	// A counter: compare-and-swap until the write lands.
	if _, err := st.Create(ctx, "counters/reports", []byte("0"), 0); err != nil {
		log.Fatal(err)
	}
	for range 3 {
		for {
			v, rev, err := st.Get(ctx, "counters/reports")
			if err != nil {
				log.Fatal(err)
			}
			n, _ := strconv.Atoi(string(v))
			_, err = st.Update(ctx, "counters/reports", []byte(strconv.Itoa(n+1)), rev, 0)
			if err == nil {
				break
			}
			if !errors.Is(err, ap.ErrRevision) {
				log.Fatal(err)
			}
		}
	}
	v, _, _ := st.Get(ctx, "counters/reports")
	fmt.Println("reports:", string(v))

	page, err := st.List(ctx, "counters/", "", 10)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("keys:", page.Keys)

	// Limits are checked before the backend is called.
	_, err = st.Create(ctx, "bad key", nil, 0)
	fmt.Println(errors.Is(err, ap.ErrBadKey))
	// Output:
	// worker-1 takes the lock: true
	// worker-2 takes the lock: false
	// reports: 3
	// keys: [counters/reports]
	// true
}
