package childproc

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"
)

const testEnv = "CHILDPROC_TEST_CHILD"

// TestChild is the children's side: what it does is its environment value.
func TestChild(t *testing.T) {
	switch os.Getenv(testEnv) {
	case "":
		t.Skip("the children's side of this package's tests")
	case "echo": // echoes stdin until it closes
		fmt.Println("READY")
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			fmt.Println("GOT " + sc.Text())
		}
		fmt.Println("BYE")
	case "hang":
		fmt.Println("READY")
		time.Sleep(time.Minute)
	case "flood": // more lines than any buffer, nobody reading them, then the last
		for i := range 20_000 {
			fmt.Println("line", i)
		}
		fmt.Println("LAST")
	}
}

func start(t *testing.T, what string) *Proc {
	t.Helper()
	p, err := Start(Config{Test: "TestChild", Env: testEnv, Value: what, Timeout: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop(10 * time.Second) })
	return p
}

const patience = time.Minute // no loaded machine takes this long to start a child

func TestExpectSendStop(t *testing.T) {
	t.Parallel()
	p := start(t, "echo")
	if _, err := p.Expect("READY", patience); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"a", "b"} {
		if err := p.Send(w); err != nil {
			t.Fatal(err)
		}
		if got, err := p.Expect("GOT ", patience); err != nil || got != w {
			t.Fatalf("Expect = %q, %v; want %q", got, err, w)
		}
	}
	if killed := p.Stop(patience); killed {
		t.Error("a child whose stdin closed had to be killed")
	}
	if _, err := p.Expect("BYE", patience); err != nil {
		t.Errorf("the child's last line, written as it exited: %v", err)
	}
	if _, err := p.Expect("never", patience); !errors.Is(err, ErrExited) {
		t.Errorf("Expect after the child exited = %v, want ErrExited", err)
	}
}

func TestKill(t *testing.T) {
	t.Parallel()
	p := start(t, "hang")
	if _, err := p.Expect("READY", patience); err != nil {
		t.Fatal(err)
	}
	p.Kill()
	select {
	case <-p.Done():
	default:
		t.Fatal("Kill returned before the child exited")
	}
	if p.Err() == nil {
		t.Error("a killed child exited cleanly")
	}
	if _, err := p.Expect("x", patience); !errors.Is(err, ErrExited) {
		t.Errorf("Expect after Kill = %v, want ErrExited", err)
	}
}

func TestExpectTimeout(t *testing.T) {
	t.Parallel()
	p := start(t, "hang")
	if _, err := p.Expect("never", 100*time.Millisecond); !errors.Is(err, ErrTimeout) {
		t.Errorf("Expect = %v, want ErrTimeout", err)
	}
	p.Kill()
}

// A child that writes more than the parent reads is never blocked by it,
// and its lines are all there after it exits.
func TestUnreadOutput(t *testing.T) {
	t.Parallel()
	p := start(t, "flood")
	select {
	case <-p.Done():
	case <-time.After(patience):
		t.Fatal("a child writing lines nobody read did not finish")
	}
	if _, err := p.Expect("LAST", patience); err != nil {
		t.Errorf("its last line: %v", err)
	}
}

func TestRunPattern(t *testing.T) {
	if got, want := RunPattern("TestX/a.b/c(d)"), `^TestX$/^a\.b$/^c\(d\)$`; got != want {
		t.Errorf("RunPattern = %q, want %q", got, want)
	}
}

// TestHungChildTimesOut: a child that hangs ends by itself at its
// -test.timeout, as every child does (DefaultTimeout when none is given).
func TestHungChildTimesOut(t *testing.T) {
	t.Parallel()
	p, err := Start(Config{Test: "TestChild", Env: testEnv, Value: "hang", Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop(10 * time.Second) })
	if _, err := p.Expect("READY", patience); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Done():
	case <-time.After(patience):
		t.Fatal("a child that hangs ran past its -test.timeout")
	}
	if p.Err() == nil {
		t.Error("a child that timed out exited 0")
	}
}
