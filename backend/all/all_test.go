package all_test

import (
	"slices"
	"testing"

	_ "github.com/asyncplatform/asyncplatform/backend/all"
	"github.com/asyncplatform/asyncplatform/driver"
)

// TestSchemes checks that importing the package registers every backend's
// URL schemes.
func TestSchemes(t *testing.T) {
	want := []string{"amqp", "amqps", "azure", "memory", "nats", "postgres", "postgresql", "redis", "redis+cluster", "redis+sentinel", "rediss", "rediss+cluster", "rediss+sentinel", "sqlite"}
	if got := driver.Schemes(); !slices.Equal(got, want) {
		t.Errorf("registered schemes %v, want %v", got, want)
	}
}
