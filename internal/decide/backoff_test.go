package decide

import (
	"math"
	"testing"
	"time"
)

func TestBackoffBounds(t *testing.T) {
	p := Policy{BackoffBase: 10 * time.Millisecond, BackoffCap: 80 * time.Millisecond}
	for failures := 1; failures < 70; failures++ {
		want := min(10*time.Millisecond<<min(failures-1, 20), 80*time.Millisecond)
		for _, jitter := range []float64{0, 0.25, 0.5, 0.999, 1} {
			if d := Backoff(p, failures, jitter); d < 0 || d > want {
				t.Fatalf("failure %d, jitter %v: backoff %v outside [0, %v]", failures, jitter, d, want)
			}
		}
		if d := Backoff(p, failures, 1); d != want {
			t.Fatalf("failure %d: the full window is %v, want %v", failures, d, want)
		}
	}
}

func TestBackoffNeverOverflows(t *testing.T) {
	for _, p := range []Policy{{BackoffBase: math.MaxInt64, BackoffCap: math.MaxInt64}, {BackoffBase: time.Second, BackoffCap: math.MaxInt64}} {
		for n := 1; n < 1000; n += 7 {
			for _, jitter := range []float64{0.5, 1} {
				if d := Backoff(p, n, jitter); d < 0 {
					t.Fatalf("%+v, failure %d: backoff %v", p, n, d)
				}
			}
		}
	}
}
