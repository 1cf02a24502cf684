package dirstore

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// restartChildEnv names the directory a TestRestart child writes to.
const restartChildEnv = "ASYNCPLATFORM_DIRSTORE_CHILD"

// restartPayload is the i-th payload TestRestart's child writes.
func restartPayload(i int) []byte {
	return bytes.Repeat([]byte(fmt.Sprintf("payload %d;", i)), 100*(i+1))
}

// TestRestart is the store's restart: a worker process opens the directory
// (making its key), writes payloads, says their references, and is killed
// with SIGKILL; a store opened on the directory afterwards, as a restarted
// worker's is, reads every payload whole under the references the dead
// process made, and deletes them.
func TestRestart(t *testing.T) {
	if dir := os.Getenv(restartChildEnv); dir != "" {
		restartChild(dir)
		return
	}
	t.Parallel()
	dir := t.TempDir()
	const n = 5
	cmd := exec.Command(os.Args[0], "-test.run=^TestRestart$", "-test.count=1")
	cmd.Env = append(os.Environ(), restartChildEnv+"="+dir)
	cmd.Stderr = os.Stderr
	// The child waits on its stdin: it ends with this process, whatever
	// ends it.
	if _, err := cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	var refs []string
	timeout := time.After(time.Minute)
	for len(refs) < n {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("the writing process ended after %d of %d references", len(refs), n)
			}
			if ref, ok := strings.CutPrefix(l, "DIRSTORE REF "); ok {
				refs = append(refs, ref)
			} else if msg, ok := strings.CutPrefix(l, "DIRSTORE ERR "); ok {
				t.Fatalf("the writing process: %s", msg)
			}
		case <-timeout:
			t.Fatalf("the writing process said %d of %d references in a minute", len(refs), n)
		}
	}
	if err := cmd.Process.Kill(); err != nil { // SIGKILL: no clean-up of any kind
		t.Fatal(err)
	}
	<-done
	ctx := context.Background()
	s := newStore(t, dir)
	for i, ref := range refs {
		got, err := s.GetJob(ctx, fmt.Sprintf("job-%d", i), ref)
		if err != nil {
			t.Errorf("after the writer's death, payload %d (%s): %v", i, ref, err)
			continue
		}
		if !bytes.Equal(got, restartPayload(i)) {
			t.Errorf("after the writer's death, payload %d: %d bytes that differ from the %d written", i, len(got), len(restartPayload(i)))
		}
		if err := s.DeleteJob(ctx, fmt.Sprintf("job-%d", i), ref); err != nil {
			t.Errorf("deleting payload %d: %v", i, err)
		}
	}
	if left, err := s.Refs(); err != nil || len(left) != 0 {
		t.Errorf("after deleting every payload: %q, %v; want none", left, err)
	}
}

// restartChild is TestRestart's writing process: it writes the payloads,
// says each reference on stdout, and waits to be killed (or for its stdin
// to close, when the test process is gone).
func restartChild(dir string) {
	s, err := New(dir)
	if err != nil {
		fmt.Println("DIRSTORE ERR " + err.Error())
		return
	}
	for i := range 5 {
		ref, err := s.Put(context.Background(), fmt.Sprintf("job-%d", i), restartPayload(i))
		if err != nil {
			fmt.Println("DIRSTORE ERR " + err.Error())
			return
		}
		fmt.Println("DIRSTORE REF " + ref)
	}
	_, _ = io.Copy(io.Discard, os.Stdin)
}
