package storetest

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/internal/childproc"
)

// raceProcs and raceRounds size Create/RaceProcesses: that many processes
// race to create each of that many keys.
const raceProcs, raceRounds = 4, 5

// testCreateRaceProcesses runs the test binary again as raceProcs worker
// processes, each with a connection of its own, and has them race to create
// one key per round, released at once: exactly one wins each round.
func testCreateRaceProcesses(t *testing.T, e *env) {
	if e.opts.SingleProcess != "" {
		t.Skipf("the store declares it cannot be shared by processes: %s", e.opts.SingleProcess)
	}
	var kids []*childproc.Proc
	t.Cleanup(func() {
		for _, k := range kids {
			k.Stop(10 * time.Second)
		}
	})
	for i := range raceProcs {
		k, err := childproc.Start(childproc.Config{Test: t.Name(), Env: childEnv, Value: e.ns + "," + strconv.Itoa(i)})
		must(t, "starting a racing process", err)
		kids = append(kids, k)
	}
	read := func(i int, want string) string {
		t.Helper()
		rest, err := kids[i].Expect(want, e.opts.Wait)
		if err != nil {
			t.Fatalf("racing process %d: %v; it said:\n%s", i, err, kids[i])
		}
		return rest
	}
	for i := range kids {
		read(i, "STORETEST READY")
	}
	ctx := e.ctx()
	for round := range raceRounds {
		for _, k := range kids { // as close together as a pipe write each
			must(t, "releasing a racing process", k.Send(strconv.Itoa(round)))
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
