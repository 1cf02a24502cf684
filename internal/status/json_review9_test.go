package status

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// A record is written as encoding/json writes it: its zero times and empty
// history left out (omitzero), so the bytes match those of earlier
// versions and stay within the sizes they were measured at.
func TestRecordBytesReview9(t *testing.T) {
	d := newStore(t)
	tk := newTracker(d, "w1")
	ctx := context.Background()
	tk.Enqueued(ctx, []Job{{ID: "j1", Queue: "q", Type: "t"}})
	b, _, err := tk.cfg.Store.Get(ctx, "job/"+key("j1"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := decode(b)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := json.Marshal(&r)
	if string(b) != string(want) {
		t.Errorf("the record written:\n %s\nencoding/json writes:\n %s", b, want)
	}
	for _, f := range []string{`"retry_at"`, `"enqueued_at"`, `"started_at"`} {
		if strings.Contains(string(b), f) {
			t.Errorf("a zero time is written (%s): %s", f, b)
		}
	}
}

// Hostile records decode as encoding/json decodes them: the same record,
// and an error where it errs.
func TestHostileRecordsReview9(t *testing.T) {
	deep := strings.Repeat(`[`, 12000) + strings.Repeat(`]`, 12000)
	for _, in := range []string{
		`{"id":"a","id":"b"}`,
		`{"ID":"a","Queue":"q","STATE":"running"}`,
		`{"id":"\xff\xfe"}`,
		`{"id":"\ud800"}`,
		`{"tries":1e400}`,
		`{"tries":99999999999999999999}`,
		`{"copy":-1}`,
		`{"ſtate":"x","\u212aey":1}`,
		`{"history":{"changes":[{"state":"waiting","at":"2020-01-01T00:00:00Z"}],"Dropped":5}}`,
		`{"history":{"changes":[{"state":"bogus","at":"2020-01-01T00:00:00Z"}]}}`,
		`{"history":[1,2]}`,
		`{"id":"x","unknown":` + deep + `}`,
	} {
		var want Record
		wantErr := json.Unmarshal([]byte(in), &want)
		got, err := decode([]byte(in))
		if (err != nil) != (wantErr != nil) || err == nil && !reflect.DeepEqual(got, want) {
			t.Errorf("%.60q: decoded %+v (%v), encoding/json: %+v (%v)", in, got, err, want, wantErr)
		}
	}
}
