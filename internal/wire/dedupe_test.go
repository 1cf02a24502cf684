package wire

import "testing"

// TestDedupeKey: the key of a copy is the same wherever it is computed, and
// differs for another copy, another job (job x's copy 1 and job x.1's copy
// 0 included), another nonce or another signing key; no nonce or a Codec
// that does not dedupe gives none.
func TestDedupeKey(t *testing.T) {
	job := func(id string, copyNo uint64, nonce string) *Job {
		j := &Job{ID: id, Copy: copyNo, Headers: map[string]string{"user": "h"}}
		if nonce != "" {
			j.Headers[StatusHeader] = nonce
		}
		return j
	}
	plain, signed := Codec{Dedupe: true}, Codec{Dedupe: true, Keys: [][]byte{[]byte("k1")}}
	k := plain.DedupeKey(job("x", 1, "n1"))
	if k == "" || len(k) != 24 {
		t.Fatalf("key %q; want 24 characters", k)
	}
	if again := plain.DedupeKey(job("x", 1, "n1")); again != k {
		t.Errorf("the same copy got %q and %q", k, again)
	}
	others := map[string]string{
		"job x.1's copy 0":    plain.DedupeKey(job("x.1", 0, "n1")),
		"copy 2":              plain.DedupeKey(job("x", 2, "n1")),
		"another nonce":       plain.DedupeKey(job("x", 1, "n2")),
		"with a signing key":  signed.DedupeKey(job("x", 1, "n1")),
		"another signing key": Codec{Dedupe: true, Keys: [][]byte{[]byte("k2")}}.DedupeKey(job("x", 1, "n1")),
	}
	seen := map[string]string{k: "job x's copy 1"}
	for what, o := range others {
		if prev, dup := seen[o]; dup {
			t.Errorf("%s has the key of %s: %q", what, prev, o)
		}
		seen[o] = what
	}
	if got := plain.DedupeKey(job("x", 1, "")); got != "" {
		t.Errorf("a job without a nonce got key %q; want none", got)
	}
	if got := (Codec{}).DedupeKey(job("x", 1, "n1")); got != "" {
		t.Errorf("a Codec that does not dedupe gave key %q", got)
	}
}
