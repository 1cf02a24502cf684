package storetest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
)

// raceProcs and raceRounds size Create/RaceProcesses: that many processes
// race to create each of that many keys.
const raceProcs, raceRounds = 4, 5

// child is one racing process, seen from the parent.
type child struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string
}

// testCreateRaceProcesses runs the test binary again as raceProcs worker
// processes, each with a connection of its own, and has them race to create
// one key per round, released at once: exactly one wins each round.
func testCreateRaceProcesses(t *testing.T, e *env) {
	if e.opts.SingleProcess != "" {
		t.Skipf("the store declares it cannot be shared by processes: %s", e.opts.SingleProcess)
	}
	var parts []string
	for _, p := range strings.Split(t.Name(), "/") {
		parts = append(parts, "^"+regexp.QuoteMeta(p)+"$")
	}
	var kids []*child
	t.Cleanup(func() {
		for _, k := range kids {
			_ = k.in.Close()
			done := make(chan struct{})
			go func() { _ = k.cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				_ = k.cmd.Process.Kill()
				<-done
			}
		}
	})
	for i := range raceProcs {
		cmd := exec.Command(os.Args[0], "-test.run="+strings.Join(parts, "/"), "-test.count=1")
		cmd.Env = append(os.Environ(), childEnv+"="+e.ns+","+strconv.Itoa(i))
		cmd.Stderr = os.Stderr
		in, err := cmd.StdinPipe()
		must(t, "stdin pipe", err)
		out, err := cmd.StdoutPipe()
		must(t, "stdout pipe", err)
		must(t, "starting a racing process", cmd.Start())
		k := &child{cmd: cmd, in: in, lines: make(chan string, 16)}
		go func() {
			defer close(k.lines)
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				k.lines <- sc.Text()
			}
		}()
		kids = append(kids, k)
	}
	read := func(i int, want string) string {
		t.Helper()
		timeout := time.After(e.opts.Wait)
		for {
			select {
			case l, ok := <-kids[i].lines:
				if !ok {
					t.Fatalf("racing process %d exited before saying %s", i, want)
				}
				if strings.HasPrefix(l, want) {
					return strings.TrimPrefix(l, want)
				}
			case <-timeout:
				t.Fatalf("racing process %d did not say %s within %v", i, want, e.opts.Wait)
			}
		}
	}
	for i := range kids {
		read(i, "STORETEST READY")
	}
	ctx := e.ctx()
	for round := range raceRounds {
		for _, k := range kids { // as close together as a pipe write each
			fmt.Fprintf(k.in, "%d\n", round)
		}
		winner, rev := -1, ""
		for i := range kids {
			switch res := read(i, "STORETEST "); {
			case strings.HasPrefix(res, "WON "):
				if winner >= 0 {
					t.Fatalf("round %d: processes %d and %d both created the key", round, winner, i)
				}
				winner, rev = i, strings.TrimPrefix(res, "WON ")
			case res == "LOST":
			default:
				t.Fatalf("round %d: process %d: %s", round, i, res)
			}
		}
		if winner < 0 {
			t.Fatalf("round %d: no process created the key", round)
		}
		v, r, err := e.store.Get(ctx, raceKey(round))
		must(t, "Get", err)
		if string(v) != strconv.Itoa(winner) || r != rev {
			t.Fatalf("round %d: the key holds %q at %q, want the winner's %d at %q", round, v, r, winner, rev)
		}
	}
}

func raceKey(round int) string { return "race/" + strconv.Itoa(round) }

// runChild is a racing process of Create/RaceProcesses: it opens its store,
// says so, and for every round number read on stdin tries to create that
// round's key, and says whether it won.
func runChild(t *testing.T, makeStore Maker, opts Options, arg string) {
	ns, id, _ := strings.Cut(arg, ",")
	t.Run("Create/RaceProcesses", func(t *testing.T) {
		e := &env{t: t, make: makeStore, opts: opts, scale: 1, ns: ns}
		s := e.in(e.connect())
		ctx := e.ctx()
		fmt.Println("STORETEST READY")
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			round, err := strconv.Atoi(sc.Text())
			if err != nil {
				fmt.Println("STORETEST bad round " + sc.Text())
				return
			}
			rev, err := s.Create(ctx, raceKey(round), []byte(id), 0)
			switch {
			case err == nil:
				fmt.Println("STORETEST WON " + rev)
			case errors.Is(err, ap.ErrKeyExists):
				fmt.Println("STORETEST LOST")
			default:
				fmt.Println("STORETEST ERR " + strings.ReplaceAll(err.Error(), "\n", " "))
			}
		}
	})
}
