package azure

import (
	"context"
	"errors"
	"net/url"
	"os"
	"strings"

	"github.com/asyncplatform/asyncplatform/driver"
)

// ConnectionStringEnv is read by the azure:// URL form.
const ConnectionStringEnv = "ASYNCPLATFORM_AZURE_CONNECTION_STRING"

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
		cfg.ConnectionString = os.Getenv(ConnectionStringEnv)
		cfg.Prefix = u.Query().Get("prefix")
		if cfg.ConnectionString == "" {
			return nil, errors.New("azure: azure:// takes its connection string from $" + ConnectionStringEnv + ", which is empty; or write azure:<connection string>")
		}
	}
	b, err := New(ctx, cfg)
	if err != nil {
		return nil, errors.New("azure: opening the storage account (queue and blob services) failed (the connection string is not shown): " + redact(err.Error(), cfg.ConnectionString))
	}
	return b, nil
}

// redact removes the connection string's secrets from an error text.
func redact(text, conn string) string {
	for _, part := range strings.Split(conn, ";") {
		k, v, ok := strings.Cut(part, "=")
		if ok && v != "" && (strings.EqualFold(k, "AccountKey") || strings.EqualFold(k, "SharedAccessSignature")) {
			text = strings.ReplaceAll(text, v, "xxxxx")
		}
	}
	return text
}
