package asyncplatform

import (
	"testing"

	"github.com/asyncplatform/asyncplatform/internal/pause"
	"github.com/asyncplatform/asyncplatform/internal/status"
	"github.com/asyncplatform/asyncplatform/internal/wire"
)

// The public constants are written out for go doc; the engines hold the
// same values.
func TestConstantsMatchTheEngines(t *testing.T) {
	if GroupHeader != wire.GroupHeader {
		t.Errorf("GroupHeader %q, the envelope reads %q", GroupHeader, wire.GroupHeader)
	}
	if MaxGroupLen != pause.MaxGroupLen {
		t.Errorf("MaxGroupLen %d, the pause engine's %d", MaxGroupLen, pause.MaxGroupLen)
	}
	if MaxStatusResult != status.MaxResult {
		t.Errorf("MaxStatusResult %d, the status engine's %d", MaxStatusResult, status.MaxResult)
	}
}
