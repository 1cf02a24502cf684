package azure

import (
	"strings"
	"testing"
)

// No secret of a connection string survives in an error text: the key, the
// SAS whole, or its signature quoted in a URL.
func TestRedact(t *testing.T) {
	conn := "BlobEndpoint=https://acct.blob.core.windows.net;SharedAccessSignature=sv=2022-11-02&ss=bq&sig=TOPSECRETSIG%2B1;AccountKey=S3CRETKEY=="
	for _, text := range []string{
		`Get "https://acct.blob.core.windows.net/c?comp=list&sig=TOPSECRETSIG%2B1&sv=2022": dial tcp: no such host`,
		`Get "https://acct.queue.core.windows.net/q?sv=2022&sig=TOPSECRETSIG%2B1": EOF`,
		`url: https://x/?SIG=TOPSECRETSIG%2B1 key S3CRETKEY==`,
		"sig%3DTOPSECRETSIG%2B1 in an escaped URL",
		"https%3A%2F%2Fx%2F%3Fsv%3D1%26sig%3DTOPSECRETSIG%2B1%26se%3D2",
	} {
		got := redact(text, conn)
		if strings.Contains(got, "TOPSECRETSIG") || strings.Contains(got, "S3CRETKEY") {
			t.Errorf("redact(%q) = %q: a secret is left", text, got)
		}
	}
	if got := redact("no secret here: sign=off", ""); got != "no secret here: sign=off" {
		t.Errorf("redact changed a text without secrets: %q", got)
	}
}
