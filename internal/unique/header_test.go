package unique

import (
	"net/url"
	"strconv"
	"testing"
	"time"
)

// TestHeaderFormat: Header writes what url.Values.Encode wrote (the format
// every job in a broker carries), and CheckHeader reads it, and headers in
// another field order, as url.ParseQuery does.
func TestHeaderFormat(t *testing.T) {
	claims := []Claim{
		{Key: "a", Rev: "17", Token: newToken(), Window: time.Hour, Release: OnSuccess},
		{Key: "user:42/report=x_1.2", Rev: "0000012a-ff", Token: newToken(), Window: time.Millisecond, Release: OnWindow},
		{Key: "legacy", Rev: "3", Window: 24 * time.Hour}, // no token
	}
	for _, c := range claims {
		v := url.Values{}
		v.Set("k", c.Key)
		v.Set("r", c.Rev)
		if c.Token != "" {
			v.Set("t", c.Token)
		}
		v.Set("w", strconv.FormatInt(c.Window.Milliseconds(), 10))
		v.Set("p", strconv.Itoa(int(c.Release)))
		if got, want := c.Header(), v.Encode(); got != want {
			t.Errorf("Header() = %q, want %q", got, want)
		}
		for _, h := range []string{c.Header(), "w=" + v.Get("w") + "&r=" + url.QueryEscape(c.Rev) + "&k=" + url.QueryEscape(c.Key) + "&p=" + v.Get("p") + "&t=" + c.Token} {
			got, err := CheckHeader(h)
			if err != nil || got != c {
				t.Errorf("CheckHeader(%q) = %+v, %v; want %+v", h, got, err, c)
			}
		}
	}
	// Headers the fast reader leaves to url.ParseQuery read as it reads them.
	for h, want := range map[string]string{
		"k=a&k=b&p=0&r=1&w=1000":     "a",
		"k=a&x=y&p=0&r=1&w=1000":     "a",
		"k=a%zz&p=0&r=1&w=1000":      "",
		"k=a;b&p=0&r=1&w=1000":       "",
		"k&p=0&r=1&w=1000":           "",
		"k=a&p=0&r=1&w=1000&t=short": "",
	} {
		c, err := CheckHeader(h)
		if c.Key != want || (want == "") != (err != nil) {
			t.Errorf("CheckHeader(%q) = %+v, %v; want key %q", h, c, err, want)
		}
	}
}

// TestHeaderAllocs: reading a claim header as Header writes it allocates
// nothing (it is read at every settle of a unique job), writing it once.
func TestHeaderAllocs(t *testing.T) {
	c := Claim{Key: "report-42", Rev: "1234", Token: newToken(), Window: time.Hour}
	h := c.Header()
	if n := testing.AllocsPerRun(100, func() { _, _ = CheckHeader(h) }); n != 0 {
		t.Errorf("CheckHeader: %v allocations, want 0", n)
	}
	if n := testing.AllocsPerRun(100, func() { _ = c.Header() }); n > 3 {
		t.Errorf("Header: %v allocations, want at most 3", n)
	}
}

// TestStoredToken: a release's check of the stored token tells the
// claim's own token from another and from a claim made before tokens.
func TestStoredToken(t *testing.T) {
	tok := newToken()
	v := value("job-1", tok)
	if !tokenEqual(storedToken(v), tok) || tokenEqual(storedToken(v), newToken()) || tokenEqual(storedToken([]byte("job-1")), tok) || !tokenEqual(storedToken([]byte("job-1")), "") {
		t.Error("storedToken/tokenEqual: a token is not told apart")
	}
}
