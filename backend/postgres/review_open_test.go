package postgres_test

import (
	"context"
	"strings"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	_ "github.com/asyncplatform/asyncplatform/backend/postgres"
)

// TestReviewOpenHidesListenURLPassword: a postgres URL whose listen_url
// parameter carries a password (a session-mode pool behind PgBouncer, its
// own credentials) must not show that password in asyncplatform.Open's
// error. describeURL names the URL with its query, and listen_url is not
// named like a secret, so the nested URL is quoted whole.
func TestReviewOpenHidesListenURLPassword(t *testing.T) {
	const pw = "listenpw4567"
	for _, raw := range []string{
		"postgres://app:mainpw1234@127.0.0.1:1/app?sslmode=nonsense&listen_url=postgres://lst:" + pw + "@127.0.0.1:1/app",
		"postgres://app:mainpw1234@127.0.0.1:1/app?dead_hold=x&listen_url=host%3D127.0.0.1+password%3D" + pw,
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := ap.Open(ctx, raw)
		cancel()
		if err == nil {
			t.Fatalf("%s opened", raw)
		}
		if strings.Contains(err.Error(), pw) {
			t.Errorf("error shows listen_url's password: %v", err)
		}
	}
}
