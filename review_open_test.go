package asyncplatform

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/asyncplatform/asyncplatform/driver"
)

func init() {
	driver.Register("reviewfail", func(context.Context, *url.URL) (driver.Backend, error) {
		return nil, errors.New("refused")
	})
}

// TestReviewOpenHidesNestedURLPassword: Open names a failed URL with its
// query (describeURL); a parameter that holds a URL or DSN of its own (the
// postgres backend's listen_url) is not named like a secret, and its
// password was quoted whole. (backend/postgres has the same case against
// the real scheme: TestReviewOpenHidesListenURLPassword.)
func TestReviewOpenHidesNestedURLPassword(t *testing.T) {
	const pw = "listenpw4567"
	for _, raw := range []string{
		"reviewfail://app:mainpw1234@127.0.0.1:1/app?listen_url=postgres://lst:" + pw + "@127.0.0.1:1/app",
		"reviewfail://app:mainpw1234@127.0.0.1:1/app?listen_url=host%3D127.0.0.1+password%3D" + pw,
	} {
		_, err := Open(context.Background(), raw)
		if err == nil {
			t.Fatalf("%s opened", raw)
		}
		if strings.Contains(err.Error(), pw) {
			t.Errorf("error shows the nested URL's password: %v", err)
		}
	}
}
