package asyncplatform

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	_ "github.com/asyncplatform/asyncplatform/backend/nats"
	"github.com/asyncplatform/asyncplatform/driver"
)

// errLeaky is the error of the leaky-open-test backend.
var errLeaky = errors.New("leaky backend")

// A backend whose errors quote its URL every way a careless one might.
func init() {
	driver.Register("leaky-open-test", func(_ context.Context, u *url.URL) (driver.Backend, error) {
		pw, _ := u.User.Password()
		return nil, fmt.Errorf("%w: dial %s: user %q password %q userinfo %s query %s params %v",
			errLeaky, u.String(), u.User.Username(), pw, u.User.String(), u.RawQuery, u.Query())
	})
}

// TestOpenRedactsSecrets: Open's errors show no credential of the URL, in any
// form: a token in the user part (NATS token auth), a percent-encoded
// password raw or decoded, a secret query parameter.
func TestOpenRedactsSecrets(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		url     string
		secrets []string
	}{
		{"leaky-open-test://S3CRETTOKEN@host:4222", []string{"S3CRETTOKEN"}},
		{"leaky-open-test://user:p%40ss%2Fw0rd@host/", []string{"p@ss/w0rd", "p%40ss%2Fw0rd", "p%40ss%2fw0rd"}},
		{"leaky-open-test://user:p%40ss%2fw0rd@host/", []string{"p@ss/w0rd", "p%40ss%2Fw0rd", "p%40ss%2fw0rd"}},
		{"leaky-open-test://tok%20en%2Bx@host/", []string{"tok en+x", "tok%20en%2Bx", "tok+en%2Bx"}},
		{"leaky-open-test://host/?password=hunter%2F22&stream=JOBS", []string{"hunter/22", "hunter%2F22"}},
		{"leaky-open-test://host/?auth_token=abcdef123", []string{"abcdef123"}},
	} {
		_, err := Open(ctx, tc.url)
		if !errors.Is(err, errLeaky) {
			t.Errorf("%s: %v, want the backend's error kept in the chain", tc.url, err)
			continue
		}
		for _, s := range tc.secrets {
			if strings.Contains(err.Error(), s) {
				t.Errorf("Open(%s): the error shows %q:\n%v", tc.url, s, err)
			}
		}
		if !strings.Contains(err.Error(), "host") {
			t.Errorf("Open(%s): the error no longer names the host: %v", tc.url, err)
		}
	}

	// A real backend: NATS quotes its URL, token and all, when it cannot
	// connect (nothing listens on port 1).
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	b, err := Open(cctx, "nats://S3CRETTOKEN@127.0.0.1:1")
	if err == nil {
		b.Close()
		t.Fatal("nats://…@127.0.0.1:1 opened")
	}
	if strings.Contains(err.Error(), "S3CRETTOKEN") {
		t.Errorf("the NATS token shows:\n%v", err)
	}

	// A secret too short to cut out of the text hides the text.
	_, err = Open(ctx, "leaky-open-test://ab:xy@host/")
	if !errors.Is(err, errLeaky) || strings.Contains(err.Error(), `"xy"`) {
		t.Errorf("a short password: %v", err)
	}
}
