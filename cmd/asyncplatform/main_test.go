package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// The demo shows each failure kind ending where the contract says.
func TestDemo(t *testing.T) {
	var out bytes.Buffer
	if err := demo(context.Background(), &out, false); err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	s := out.String()
	for _, want := range []string{
		"greet    ✔ succeeded",
		"flaky    try 3  (failures 2, crashes 0)",
		"busy     ↺ rejected",
		"crash    try 4  (failures 0, crashes 3)",
		"crash    reason=poisoned         tries=4",
		"parse    reason=invalid          tries=1",
		"explode  reason=retries_exceeded tries=3",
		"doomed   reason=retries_exceeded tries=3",
		"The dead-letter queue is empty.",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("demo output lacks %q", want)
		}
	}
	if strings.Count(s, "reason=") != 4 {
		t.Errorf("want 4 dead letters drained:\n%s", s)
	}
	if t.Failed() {
		t.Log(s)
	}
}
