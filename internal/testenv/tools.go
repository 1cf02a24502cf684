package testenv

import (
	"os/exec"
	"testing"
)

// Tool returns the path of the named program (tmux, zsh), or skips the test
// when it is not installed, which is a failure when Required: scripts/test
// installs what the tests need, so CI never goes green by skipping them.
func Tool(t testing.TB, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	if Required() {
		t.Fatalf("%s is not installed and %s is set, so this is a failure, not a skip (scripts/test installs it): %v", name, RequireEnv, err)
	}
	t.Skipf("%s is not installed (scripts/test installs it; set %s to make this a failure): %v", name, RequireEnv, err)
	return ""
}
