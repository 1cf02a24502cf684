package wire

import (
	"bytes"
	"encoding/hex"
	"errors"
	"testing"
	"time"
)

// The envelopes of goldenJob and goldenDead as written by the release of
// 2026-11-28 (commit 09df552): brokers hold messages and dead letters
// written by earlier versions, and every later version must read them, and
// write a job with no new feature in use byte for byte the same.
const (
	goldenJobHex    = "a54a012430313930613162322d633364342d376535662d386139622d3063316432653366346135620a656d61696c2e73656e640001016b0176aab4aed8c7bfce972f80a087eaafc5ce972f80c0bef198cbce972f0302010903000480a8d6b90780e0ba84bf03010210747279203120617420783a20626f6f6d1174727920323a206e6f206f7574636f6d65057265662d31"
	goldenInlineHex = "a54a012430313930613162322d633364342d376535662d386139622d306331643265336634613563017404000102ff008080d0e2c6bfce972f0000000000000000000000000000"
	goldenDeadHex   = "a5440108706f69736f6e65640a6974206372617368656406686f73743a3106656d61696c7380e0f5f881d1ce972f009101a54a012430313930613162322d633364342d376535662d386139622d3063316432653366346135620a656d61696c2e73656e640001016b0176aab4aed8c7bfce972f80a087eaafc5ce972f80c0bef198cbce972f0302010903000480a8d6b90780e0ba84bf03010210747279203120617420783a20626f6f6d1174727920323a206e6f206f7574636f6d65057265662d31"
)

// goldenJob is an offloaded job (PayloadRef set: the envelope carries no
// payload) with every other field set.
func goldenJob() *Job {
	rl, pl := 0, 4
	return &Job{
		ID: "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", Type: "email.send", Headers: map[string]string{"k": "v"},
		EnqueuedAt: time.Unix(1700000000, 123456789), NotBefore: time.Unix(1700000100, 0), Deadline: time.Unix(1700000200, 0),
		Failures: 3, Crashes: 2, Unhandled: 1, Copy: 9, Errors: []string{"try 1 at x: boom", "try 2: no outcome"},
		Policy:     Policy{RetryLimit: &rl, PoisonLimit: &pl, BackoffBase: time.Second, BackoffCap: time.Minute, Timeout: -1},
		PayloadRef: "ref-1",
	}
}

func mustHex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func sameJob(t *testing.T, what string, got, want *Job) {
	t.Helper()
	if got.ID != want.ID || got.Type != want.Type || !bytes.Equal(got.Payload, want.Payload) || len(got.Headers) != 1 || got.Headers["k"] != "v" ||
		!got.EnqueuedAt.Equal(want.EnqueuedAt) || !got.NotBefore.Equal(want.NotBefore) || !got.Deadline.Equal(want.Deadline) ||
		got.Failures != want.Failures || got.Crashes != want.Crashes || got.Unhandled != want.Unhandled || got.Copy != want.Copy ||
		got.Suspect != want.Suspect || len(got.Errors) != 2 || got.Errors[0] != want.Errors[0] || got.Errors[1] != want.Errors[1] ||
		got.Policy.RetryLimit == nil || *got.Policy.RetryLimit != 0 || got.Policy.PoisonLimit == nil || *got.Policy.PoisonLimit != 4 ||
		got.Policy.BackoffBase != time.Second || got.Policy.BackoffCap != time.Minute || got.Policy.Timeout != -1 || got.PayloadRef != want.PayloadRef {
		t.Errorf("%s:\n got %+v\nwant %+v", what, *got, *want)
	}
}

func TestGoldenEnvelopes(t *testing.T) {
	old := mustHex(t, goldenJobHex)
	var got Job
	if err := DecodeJob(old, &got, nil); err != nil {
		t.Fatalf("decoding an envelope written by 09df552: %v", err)
	}
	sameJob(t, "an envelope written by 09df552", &got, goldenJob())
	if enc := EncodeJob(goldenJob()); !bytes.Equal(enc, old) {
		t.Errorf("a job with no new feature in use is written differently from 09df552:\n got %x\nwant %x", enc, old)
	}

	oldDead := mustHex(t, goldenDeadHex)
	var d Dead
	if err := DecodeDead(oldDead, &d); err != nil {
		t.Fatalf("decoding a dead letter written by 09df552: %v", err)
	}
	if d.Reason != "poisoned" || d.Error != "it crashed" || d.Worker != "host:1" || d.Queue != "emails" || !d.DeadAt.Equal(time.Unix(1700000300, 0)) || d.Raw != nil {
		t.Errorf("a dead letter written by 09df552: got %+v", d)
	}
	sameJob(t, "the job of a dead letter written by 09df552", &d.Job, goldenJob())
	want := &Dead{Job: *goldenJob(), Reason: "poisoned", Error: "it crashed", Worker: "host:1", Queue: "emails", DeadAt: time.Unix(1700000300, 0)}
	if enc := EncodeDead(want); !bytes.Equal(enc, oldDead) {
		t.Errorf("a dead letter is written differently from 09df552:\n got %x\nwant %x", enc, oldDead)
	}

	inline := mustHex(t, goldenInlineHex)
	var small Job
	if err := DecodeJob(inline, &small, nil); err != nil {
		t.Fatalf("decoding a job with its payload inline written by 09df552: %v", err)
	}
	if small.Type != "t" || !bytes.Equal(small.Payload, []byte{0, 1, 2, 0xff}) || !small.EnqueuedAt.Equal(time.Unix(1700000000, 0)) || small.Suspect {
		t.Errorf("a job with its payload inline written by 09df552: got %+v", small)
	}
	if enc := EncodeJob(&small); !bytes.Equal(enc, inline) {
		t.Errorf("a job with its payload inline is written differently from 09df552:\n got %x\nwant %x", enc, inline)
	}

	// The suspect flag, added since, survives a round trip and leaves the
	// rest as it was.
	s := goldenJob()
	s.Suspect = true
	var back Job
	if err := DecodeJob(EncodeJob(s), &back, nil); err != nil {
		t.Fatal(err)
	}
	sameJob(t, "a suspect's envelope", &back, s)
}

// A job signed and bound to its queue (Codec.Encode with keys) is the
// signed format of 09df552 around a plain envelope of version 1, its binding
// in two headers: a worker of that version verifies and decodes it, so a
// rolling upgrade dead-letters nothing.
func TestBoundSignatureReadsAsBefore(t *testing.T) {
	key := []byte("0123456789abcdef")
	c := Codec{Keys: [][]byte{key}, MaxBody: 1 << 20}
	b := c.Encode("emails", goldenJob())
	if b[0] != envMagic || b[2] != signedVersion {
		t.Fatalf("a bound job is not in the signed format of 09df552: % x", b[:3])
	}
	body, err := Unwrap(b, [][]byte{key})
	if err != nil || body[2] != envVersion {
		t.Fatalf("Unwrap = % x…, %v; want a version-%d envelope", body[:min(3, len(body))], err, envVersion)
	}
	var j Job
	if err := DecodeJob(body, &j, nil); err != nil {
		t.Fatal(err)
	}
	if j.Headers[QueueHeader] != "emails" || j.Headers[SignedAtHeader] == "" || j.Headers["k"] != "v" || len(j.Headers) != 3 {
		t.Errorf("headers %v; want k, the queue and the signing time", j.Headers)
	}
	if len(goldenJob().Headers) != 1 {
		t.Error("Encode wrote to the job's own headers")
	}
	if err := c.Bound("emails", &j, time.Now()); err != nil {
		t.Errorf("Bound on its own queue: %v", err)
	}
	if err := c.Bound("admin", &j, time.Now()); !errors.Is(err, ErrWrongQueue) {
		t.Errorf("Bound on another queue: %v; want ErrWrongQueue", err)
	}
}
