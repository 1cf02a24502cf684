package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"runtime"
	"testing"
	"time"
)

func limit(n int) *int { return &n }

func TestEnvelopeRoundTrip(t *testing.T) {
	j := &Job{
		ID: "id", Type: "type", Payload: []byte{0, 1, 2, 0xff}, Headers: map[string]string{"k": "v"},
		EnqueuedAt: time.Unix(0, 12345), NotBefore: time.Unix(5, 0), Deadline: time.Unix(10, 0),
		Failures: 3, Crashes: 2, Unhandled: 1, Copy: 9, Suspect: true, Errors: []string{"a", "b"},
		Policy: Policy{RetryLimit: limit(0), PoisonLimit: limit(4), BackoffBase: time.Second, BackoffCap: time.Minute, Timeout: -1},
	}
	var got Job
	if err := DecodeJob(EncodeJob(j), &got, nil); err != nil {
		t.Fatal(err)
	}
	if got.ID != j.ID || got.Type != j.Type || !bytes.Equal(got.Payload, j.Payload) || got.Headers["k"] != "v" ||
		!got.EnqueuedAt.Equal(j.EnqueuedAt) || !got.NotBefore.Equal(j.NotBefore) || !got.Deadline.Equal(j.Deadline) ||
		got.Failures != 3 || got.Crashes != 2 || got.Unhandled != 1 || got.Copy != 9 || !got.Suspect || len(got.Errors) != 2 ||
		*got.Policy.RetryLimit != 0 || *got.Policy.PoisonLimit != 4 || got.Policy.Timeout != -1 || got.Policy.BackoffCap != time.Minute {
		t.Errorf("round trip lost something:\n got %+v\nwant %+v", got, *j)
	}
	for n := range len(EncodeJob(j)) { // every truncation is an error, never a panic
		if err := DecodeJob(EncodeJob(j)[:n], &Job{}, nil); err == nil {
			t.Errorf("truncated to %d bytes: no error", n)
		}
	}
}

// Decoding a job costs one allocation, its ID, when it has no headers, no
// history and no policy limits (a registered type's name is reused and the
// payload aliases the body); a limit that is set costs one more.
func TestDecodeJobAllocations(t *testing.T) {
	names := map[string]string{"t": "t"}
	for _, c := range []struct {
		pol  Policy
		want float64
	}{{Policy{}, 1}, {Policy{RetryLimit: limit(3)}, 2}, {Policy{RetryLimit: limit(3), PoisonLimit: limit(0)}, 3}} {
		b := EncodeJob(&Job{ID: "0192f0c4-5e1a-7b3c-8d2e-4f5a6b7c8d9e", Type: "t", Payload: make([]byte, 100), EnqueuedAt: time.Now(), Policy: c.pol})
		var j Job
		if got := testing.AllocsPerRun(100, func() {
			j = Job{}
			if err := DecodeJob(b, &j, names); err != nil {
				t.Fatal(err)
			}
		}); got != c.want {
			t.Errorf("policy %+v: %v allocations per decode, want %v", c.pol, got, c.want)
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

func TestSignature(t *testing.T) {
	body := EncodeJob(&Job{ID: "1", Type: "t", Payload: []byte("p")})
	key, other := []byte("key"), []byte("other")
	signed := Sign(body, key)
	if got, err := Unwrap(signed, [][]byte{other, key}); err != nil || !bytes.Equal(got, body) {
		t.Fatalf("Unwrap with the key: %q, %v", got, err)
	}
	if _, err := Unwrap(signed, [][]byte{other}); !errors.Is(err, ErrBadSignature) {
		t.Errorf("wrong key: %v, want ErrBadSignature", err)
	}
	if _, err := Unwrap(body, [][]byte{key}); !errors.Is(err, ErrUnsigned) {
		t.Errorf("unsigned with a key: %v, want ErrUnsigned", err)
	}
	if got, err := Unwrap(signed, nil); err != nil || !bytes.Equal(got, body) {
		t.Errorf("no key strips the signature: %q, %v", got, err)
	}
	tampered := bytes.Clone(signed)
	tampered[len(tampered)-1] ^= 1
	if _, err := Unwrap(tampered, [][]byte{key}); !errors.Is(err, ErrBadSignature) {
		t.Errorf("tampered: %v, want ErrBadSignature", err)
	}
	for n := range len(signed) {
		if got, err := Unwrap(signed[:n], [][]byte{key}); err == nil {
			t.Errorf("truncated to %d bytes: %q, no error", n, got)
		}
	}
}

// A crafted message whose counts claim far more than it holds must cost at
// most a small multiple of its size to decode (the decoder once sized a map
// from a header count checked only against the message length: 1.2 GB for a
// 16 MB message).
func TestDecodeIsBounded(t *testing.T) {
	const size = 16 << 20
	for _, c := range []struct {
		name  string
		craft func() []byte
	}{
		{"headers", func() []byte {
			b := []byte{envMagic, kindJob, envVersion, 1, 'x', 1, 't', 0}
			b = binary.AppendUvarint(b, size/2)
			return append(b, make([]byte, size)...) // empty keys and values
		}},
		{"distinct headers", func() []byte {
			b := []byte{envMagic, kindJob, envVersion, 1, 'x', 1, 't', 0}
			b = binary.AppendUvarint(b, size/8)
			for i := 0; len(b) < size; i++ {
				b = binary.AppendUvarint(b, 3)
				b = append(b, byte(i), byte(i>>8), byte(i>>16), 0)
			}
			return b
		}},
		{"errors", func() []byte {
			j := EncodeJob(&Job{ID: "x", Type: "t"})
			b := j[:len(j)-2] // up to the error count
			b = binary.AppendUvarint(b, size)
			return append(b, make([]byte, size)...)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			msg := c.craft()
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			var j Job
			err := DecodeJob(msg, &j, nil)
			runtime.ReadMemStats(&after)
			allocated := after.TotalAlloc - before.TotalAlloc
			t.Logf("%d-byte message: %v; allocated %d bytes", len(msg), err, allocated)
			if allocated > 3*uint64(len(msg)) {
				t.Errorf("decoding a %d-byte message allocated %d bytes (%.1f×)", len(msg), allocated, float64(allocated)/float64(len(msg)))
			}
		})
	}
}

func FuzzDecodeDead(f *testing.F) {
	f.Add(EncodeDead(&Dead{Reason: "invalid", Error: "e", Worker: "w", Queue: "q", Raw: []byte("raw")}))
	f.Add(EncodeDead(&Dead{Reason: "poisoned", Job: Job{ID: "x", Type: "t", Headers: map[string]string{"a": "b"}, Errors: []string{"e"}}}))
	f.Add([]byte{envMagic, kindDead, envVersion})
	f.Fuzz(func(t *testing.T, b []byte) {
		var d Dead
		if DecodeDead(b, &d) == nil {
			var again Dead
			if err := DecodeDead(EncodeDead(&d), &again); err != nil {
				t.Fatalf("re-encoding a decoded record fails to decode: %v", err)
			}
		}
		_, _ = Unwrap(b, [][]byte{[]byte("k")})
	})
}
