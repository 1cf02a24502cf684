package status

import (
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"
)

// The records' codec writes the bytes encoding/json writes and reads them
// back as encoding/json reads them, for records of every shape: HTML and
// control characters escaped, results in base64, zero times left out,
// times in every zone and precision. The one difference: invalid UTF-8 is
// replaced by U+FFFD written as itself, where encoding/json writes the
// escape \ufffd (the same string read back).
func TestCodecMatchesStdlib(t *testing.T) {
	rng := rand.New(rand.NewPCG(35, 9))
	texts := []string{"", "plain", "<script>&amp;</script>", "tab\tnl\n\x00\x1f", "\xff\xfe broken", "é ☃ 𝄞", "\u2028\u2029", `"quoted" \ back`}
	text := func() string { return texts[rng.IntN(len(texts))] }
	zones := []*time.Location{time.UTC, time.FixedZone("x", -7*3600-1800), time.FixedZone("y", 14*3600)}
	when := func() time.Time {
		if rng.IntN(3) == 0 {
			return time.Time{}
		}
		return time.Unix(rng.Int64N(1<<34), rng.Int64N(1e9)).In(zones[rng.IntN(len(zones))])
	}
	states := []State{Waiting, Scheduled, Running, Retrying, Succeeded, DeadLettered, Cancelled}
	for i := range 2000 {
		r := Record{
			ID: text(), Queue: text(), Type: text(), State: states[rng.IntN(len(states))],
			Tries: rng.IntN(1 << 20), Failures: rng.IntN(5), Crashes: rng.IntN(5) - 1,
			Reason: text(), Error: text(), RetryAt: when(), EnqueuedAt: when(), StartedAt: when(), UpdatedAt: when(),
			Worker: text(), CancelRequested: rng.IntN(2) == 0, Copy: rng.Uint64() >> rng.IntN(64), Nonce: text(),
		}
		if rng.IntN(2) == 0 {
			r.Result = []byte(text())
			r.ResultSize = len(r.Result)
		}
		for range rng.IntN(MaxHistory + 1) {
			at := when()
			if at.IsZero() {
				at = time.Unix(1, 0).UTC()
			}
			r.History.Changes = append(r.History.Changes, Change{State: states[rng.IntN(len(states))], At: at, Try: rng.IntN(4), Reason: text()})
		}
		r.History.Dropped = rng.IntN(3)
		got := encode(&r)
		want, err := json.Marshal(&r)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != strings.ReplaceAll(string(want), `\ufffd`, "\uFFFD") {
			t.Fatalf("record %d written as\n %s\nencoding/json writes\n %s", i, got, want)
		}
		back, err := decode(got)
		var stdBack Record
		stdErr := json.Unmarshal(want, &stdBack)
		if (err != nil) != (stdErr != nil) || !reflect.DeepEqual(back, stdBack) {
			t.Fatalf("record %d read back as\n %+v (%v)\nencoding/json reads\n %+v (%v)", i, back, err, stdBack, stdErr)
		}
	}
}
