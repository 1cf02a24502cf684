package azure

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"

	"github.com/asyncplatform/asyncplatform/driver"
)

func init() { driver.Register("azure", openURL) }

// openURL opens a Backend for asyncplatform.Open from an azure: URL in
// either form (see the package documentation, URLs). Errors never quote the
// connection string: it holds the account key.
func openURL(ctx context.Context, u *url.URL) (driver.Backend, error) {
	cfg := Config{}
	if u.Opaque != "" {
		// A connection string may hold '?': take everything after "azure:".
		cfg.ConnectionString = strings.TrimPrefix(u.String(), u.Scheme+":")
	} else {
		cfg.Prefix = u.Query().Get("prefix") // the connection string is New's default
	}
	b, err := New(ctx, cfg)
	if errors.Is(err, errNoAccount) {
		return nil, fmt.Errorf("%w; or write azure:<connection string>", err)
	}
	if err != nil {
		// The connection string New used: the URL's, or the default's.
		return nil, errors.New("azure: opening the storage account (queue and blob services) failed (the connection string is not shown): " + redact(err.Error(), cfg.withDefaults().ConnectionString))
	}
	return b, nil
}

// redact removes the connection string's secrets from an error text: the
// account key, the shared access signature whole, and any SAS signature
// (sig=...) however an SDK quoted its URL.
func redact(text, conn string) string {
	for _, part := range strings.Split(conn, ";") {
		k, v, ok := strings.Cut(part, "=")
		if ok && v != "" && (strings.EqualFold(k, "AccountKey") || strings.EqualFold(k, "SharedAccessSignature")) {
			text = strings.ReplaceAll(text, v, "xxxxx")
		}
	}
	return sasSig.ReplaceAllString(text, "${1}xxxxx")
}

// sasSig matches the signature parameter of a SAS URL, plain or escaped.
var sasSig = regexp.MustCompile(`(?i)((?:^|[?&;\s"']|%26|%3F)sig(?:=|%3D))[^&;\s"']+`)
