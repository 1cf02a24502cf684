package kv

import (
	"context"
	"errors"
	"strings"
	"testing"
)

func TestRetry(t *testing.T) {
	t.Parallel()
	other := errors.New("the store is down")
	tests := []struct {
		name      string
		conflicts int   // the step meets a conflict this many times first
		then      error // and then returns this
		wantCalls int
		wantErr   error // matched with errors.Is; nil for none
	}{
		{name: "FirstTry", conflicts: 0, then: nil, wantCalls: 1},
		{name: "AfterConflicts", conflicts: 3, then: nil, wantCalls: 4},
		{name: "OtherErrorAtOnce", conflicts: 0, then: other, wantCalls: 1, wantErr: other},
		{name: "OtherErrorAfterConflicts", conflicts: 2, then: other, wantCalls: 3, wantErr: other},
		{name: "LastTryWins", conflicts: MaxTries - 1, then: nil, wantCalls: MaxTries},
		{name: "GivesUp", conflicts: MaxTries + 5, then: nil, wantCalls: MaxTries, wantErr: ErrContended},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			calls := 0
			err := Retry(context.Background(), func() error {
				calls++
				if calls <= tt.conflicts {
					return ErrRetry
				}
				return tt.then
			})
			if calls != tt.wantCalls {
				t.Errorf("step ran %d times, want %d", calls, tt.wantCalls)
			}
			switch {
			case tt.wantErr == nil && err != nil:
				t.Errorf("Retry = %v, want nil", err)
			case tt.wantErr != nil && !errors.Is(err, tt.wantErr):
				t.Errorf("Retry = %v, want an error matching %v", err, tt.wantErr)
			}
			if errors.Is(err, ErrRetry) {
				t.Errorf("Retry = %v: ErrRetry is the step's word to Retry, never returned", err)
			}
		})
	}
}

// A ctx that ends while Retry pauses between tries ends it.
func TestRetryContextEnds(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	calls := 0
	err := Retry(ctx, func() error { calls++; return ErrRetry })
	if !errors.Is(err, context.Canceled) || errors.Is(err, ErrContended) {
		t.Errorf("Retry = %v, want context.Canceled (and not ErrContended: the key did not keep changing)", err)
	}
	// The first conflict is tried again at once; the pause before the
	// third try finds the ctx ended.
	if calls != 2 {
		t.Errorf("step ran %d times, want 2", calls)
	}
}

func TestNamespaces(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for _, n := range All {
		p := n.Prefix()
		if !strings.HasPrefix(string(n), "_") {
			t.Errorf("namespace %q: want a leading '_' (user namespaces cannot have one)", n)
		}
		if !strings.HasSuffix(p, "/") || strings.Count(p, "/") != 1 {
			t.Errorf("namespace %q: prefix %q, want the name and one '/'", n, p)
		}
		if seen[p] {
			t.Errorf("namespace %q listed twice", n)
		}
		seen[p] = true
	}
	for a := range seen {
		for b := range seen {
			if a != b && strings.HasPrefix(b, a) {
				t.Errorf("prefix %q holds prefix %q: their keys would mix", a, b)
			}
		}
	}
	if len(All) != 9 {
		t.Errorf("All lists %d namespaces; every one the platform uses belongs there", len(All))
	}
}

func TestSegment(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("a", 201)
	tests := []struct {
		in     string
		hashed bool
	}{
		{in: "job-1", hashed: false},
		{in: "a:b=c.d_e", hashed: false},
		{in: strings.Repeat("a", 200), hashed: false},
		{in: "", hashed: true},
		{in: long, hashed: true},
		{in: "a/b", hashed: true},
		{in: "has space", hashed: true},
		{in: "sha-0123", hashed: true}, // it could be another string's hash
	}
	for _, tt := range tests {
		got := Segment(tt.in)
		if hashed := got != tt.in; hashed != tt.hashed {
			t.Errorf("Segment(%.20q) = %.30q: hashed %v, want %v", tt.in, got, hashed, tt.hashed)
		}
		if tt.hashed && (!strings.HasPrefix(got, "sha-") || len(got) != 44) {
			t.Errorf("Segment(%.20q) = %q, want sha- and 40 hex digits", tt.in, got)
		}
		if strings.Contains(got, "/") {
			t.Errorf("Segment(%.20q) = %q: more than one segment", tt.in, got)
		}
	}
	if Segment("a/b") == Segment("a/c") {
		t.Error("two strings hashed to one segment")
	}
}
