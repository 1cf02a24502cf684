package postgres

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

func TestParseURL(t *testing.T) {
	u, _ := url.Parse("postgres://app:s3cret@db:5432/app?sslmode=disable&prefix=jobs&dead_hold=1m&idle_wait=200ms&max_body=4096&skip_migrate=true&pool_max_conns=7")
	cfg, err := parseURL(u)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Prefix != "jobs" || cfg.DeadHold != time.Minute || cfg.IdleWait != 200*time.Millisecond || cfg.MaxBody != 4096 || !cfg.SkipMigrate {
		t.Errorf("parsed %+v", cfg)
	}
	if strings.Contains(cfg.URL, "prefix") || !strings.Contains(cfg.URL, "pool_max_conns=7") {
		t.Errorf("URL left to pgx: %s", cfg.URL)
	}
}

// TestOpenHidesPassword opens URLs that fail at each stage: no error may
// show the password.
func TestOpenHidesPassword(t *testing.T) {
	const pw = "s3cretpw"
	for _, raw := range []string{
		"postgres://app:" + pw + "@127.0.0.1:1/app?dead_hold=x",
		"postgres://app:" + pw + "@127.0.0.1:1/app?prefix=Bad-Prefix",
		"postgres://app:" + pw + "@127.0.0.1:1/app?sslmode=nonsense",
		"postgres://app:" + pw + "@127.0.0.1:1/app?connect_timeout=1",
		"postgresql://app:" + pw + "@127.0.0.1:1/app?listen_url=postgres://x:" + pw + "@h:bad",
	} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		open := driver.Lookup(u.Scheme)
		if open == nil {
			t.Fatalf("scheme %s not registered", u.Scheme)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err = open(ctx, u)
		cancel()
		if err == nil {
			t.Fatalf("%s opened", raw)
		}
		if strings.Contains(err.Error(), pw) {
			t.Errorf("error shows the password: %v", err)
		}
	}
}
