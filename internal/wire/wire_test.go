package wire

import (
	"bytes"
	"testing"
	"time"
)

func limit(n int) *int { return &n }

func TestEnvelopeRoundTrip(t *testing.T) {
	j := &Job{
		ID: "id", Type: "type", Payload: []byte{0, 1, 2, 0xff}, Headers: map[string]string{"k": "v"},
		EnqueuedAt: time.Unix(0, 12345), NotBefore: time.Unix(5, 0), Deadline: time.Unix(10, 0),
		Failures: 3, Crashes: 2, Unhandled: 1, Copy: 9, Errors: []string{"a", "b"},
		Policy: Policy{RetryLimit: limit(0), PoisonLimit: limit(4), BackoffBase: time.Second, BackoffCap: time.Minute, Timeout: -1},
	}
	var got Job
	if err := DecodeJob(EncodeJob(j), &got, nil); err != nil {
		t.Fatal(err)
	}
	if got.ID != j.ID || got.Type != j.Type || !bytes.Equal(got.Payload, j.Payload) || got.Headers["k"] != "v" ||
		!got.EnqueuedAt.Equal(j.EnqueuedAt) || !got.NotBefore.Equal(j.NotBefore) || !got.Deadline.Equal(j.Deadline) ||
		got.Failures != 3 || got.Crashes != 2 || got.Unhandled != 1 || got.Copy != 9 || len(got.Errors) != 2 ||
		*got.Policy.RetryLimit != 0 || *got.Policy.PoisonLimit != 4 || got.Policy.Timeout != -1 || got.Policy.BackoffCap != time.Minute {
		t.Errorf("round trip lost something:\n got %+v\nwant %+v", got, *j)
	}
	for n := range len(EncodeJob(j)) { // every truncation is an error, never a panic
		if err := DecodeJob(EncodeJob(j)[:n], &Job{}, nil); err == nil {
			t.Errorf("truncated to %d bytes: no error", n)
		}
	}
}

func FuzzDecodeJob(f *testing.F) {
	f.Add(EncodeJob(&Job{ID: "x", Type: "t", Payload: []byte("p"), Headers: map[string]string{"a": "b"}}))
	f.Add([]byte("not a job"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var j Job
		if DecodeJob(b, &j, nil) == nil {
			again := EncodeJob(&j)
			var k Job
			if err := DecodeJob(again, &k, nil); err != nil {
				t.Fatalf("re-encoding a decoded job fails to decode: %v", err)
			}
		}
		var dl Dead
		_ = DecodeDead(b, &dl)
	})
}
