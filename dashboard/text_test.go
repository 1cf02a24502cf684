package dashboard

import (
	"strings"
	"testing"
	"time"
)

func TestVisible(t *testing.T) {
	for in, want := range map[string]string{
		"plain text, é ü 日本":     "plain text, é ü 日本",
		"esc \x1b[31mred":        `esc \x1b[31mred`,
		"bidi \u202egnp.exe":     `bidi \u202egnp.exe`,
		"zero\u200bwidth\ufeff":  `zero\u200bwidth\ufeff`,
		"nul \x00 del \x7f":      `nul \x00 del \x7f`,
		"c1 \u009b":              `c1 \x9b`,
		"bad \xff utf8":          `bad \xff utf8`,
		"line\nbreak\ttab\r":     `line\nbreak\ttab\r`,
		"<script>&amp;</script>": "<script>&amp;</script>", // html/template's job
	} {
		if got := visible(in, false); got != want {
			t.Errorf("visible(%q) = %q, want %q", in, got, want)
		}
	}
	if got := visible("a\nb\tc\x1b", true); got != "a\nb\tc\\x1b" {
		t.Errorf("multiline: %q", got)
	}
}

func TestRenderPayload(t *testing.T) {
	for _, tc := range []struct {
		in         string
		asked      string
		view, body string
		note       bool
	}{
		{`{"a":[1,2]}`, "", viewJSON, "{\n  \"a\": [\n    1,\n    2\n  ]\n}", false},
		{`{"a":1}`, viewText, viewText, `{"a":1}`, false},
		{"hello\nworld", "", viewText, "hello\nworld", false},
		{"hello", viewJSON, viewText, "hello", true},
		{"\xde\xad\xbe\xef", "", viewHex, "00000000  de ad be ef", false},
		{"\xff\xfe", viewText, viewHex, "00000000  ff fe", true},
		{"ab", viewHex, viewHex, "|ab|", false},
		{"\x1b[2J", viewText, viewText, `\x1b[2J`, false},
	} {
		pv := renderPayload([]byte(tc.in), tc.asked)
		if pv.View != tc.view || !strings.Contains(pv.Body, tc.body) || (pv.Note != "") != tc.note {
			t.Errorf("renderPayload(%q, %q) = view %s, body %q, note %q; want view %s with %q, a note: %v", tc.in, tc.asked, pv.View, pv.Body, pv.Note, tc.view, tc.body, tc.note)
		}
	}
	big := renderPayload([]byte(strings.Repeat("é", maxShown)), "")
	if !big.Cut || big.View != viewText || len(big.Body) > maxShown {
		t.Errorf("a large payload: cut %v, view %s, %d bytes shown", big.Cut, big.View, len(big.Body))
	}
}

func TestParseAge(t *testing.T) {
	for in, want := range map[string]time.Duration{"": 0, "90s": 90 * time.Second, "2h30m": 150 * time.Minute, "3d": 72 * time.Hour, "1d12h": 36 * time.Hour} {
		if got, err := parseAge(in); err != nil || got != want {
			t.Errorf("parseAge(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"x", "-1h", "d", "1w", "3dd"} {
		if _, err := parseAge(in); err == nil {
			t.Errorf("parseAge(%q) took it", in)
		}
	}
}

func TestPosition(t *testing.T) {
	for _, p := range []position{{}, {Off: 1000, Skip: 7, Cursor: "1000"}, {Off: 5, Cursor: "a.b.c|weird"}} {
		got, err := decodePosition(p.encode())
		if err != nil || got != p {
			t.Errorf("%+v → %q → %+v, %v", p, p.encode(), got, err)
		}
	}
	for _, s := range []string{"!!", "MQ", "LTEuMC4", "MS4xMDAwMC4"} { // not base64, "1", "-1.0.", "1.10000."
		if _, err := decodePosition(s); err == nil {
			t.Errorf("decodePosition(%q) took it", s)
		}
	}
}

// nestedJSON is the hostile payload of issue 34: 9,990 nested arrays
// around 5,000 numbers, 30 KB that json.Indent turns into 300 MB.
func nestedJSON() []byte {
	return []byte(strings.Repeat("[", 9990) + strings.Repeat("1,", 4999) + "1" + strings.Repeat("]", 9990))
}

func TestRenderPayloadIsBounded(t *testing.T) {
	wide := "[" + strings.Repeat(`{"k":[1,2,3]},`, 15_000) + "1]" // shallow, but over maxIndented once indented
	deep := strings.Repeat("[", maxJSONDepth+1) + strings.Repeat("]", maxJSONDepth+1)
	for name, in := range map[string][]byte{"nested": nestedJSON(), "deep": []byte(deep), "wide": []byte(wide)} {
		for _, asked := range []string{viewAuto, viewJSON} {
			pv := renderPayload(in, asked)
			if pv.View != viewText || pv.Note == "" || len(pv.Body) > 2*len(in) {
				t.Errorf("%s payload of %d bytes, view %q asked: view %s, note %q, %d bytes shown; want text, a note, at most twice the payload", name, len(in), asked, pv.View, pv.Note, len(pv.Body))
			}
		}
	}
	ok := strings.Repeat("[", maxJSONDepth) + strings.Repeat("]", maxJSONDepth)
	if pv := renderPayload([]byte(ok), ""); pv.View != viewJSON || pv.Note != "" {
		t.Errorf("JSON nested %d levels: view %s, note %q; want JSON", maxJSONDepth, pv.View, pv.Note)
	}
	// Brackets inside strings are text, not nesting.
	str := `{"s":"` + strings.Repeat(`[\"{`, 1000) + `"}`
	if pv := renderPayload([]byte(str), ""); pv.View != viewJSON {
		t.Errorf("brackets in a string: view %s, note %q; want JSON", pv.View, pv.Note)
	}
}
