package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/internal/testenv"
)

// complete runs "asyncctl __complete" as a completion script does.
func completions(t *testing.T, args ...string) []string {
	t.Helper()
	out := mustCtl(t, exitOK, "", append([]string{"__complete"}, args...)...)
	return strings.Split(strings.TrimSuffix(out, "\n"), "\n")
}

// Commands, subcommands, flags, flag values, queue names and dead-letter
// IDs are completed, in every place they can be typed.
func TestComplete(t *testing.T) {
	t.Parallel()
	url := memURL(t)
	jobs := seed(t, url, "emails", seedJob("email.send", "a"))
	mustCtl(t, exitOK, "", "enqueue", "--url", url, "--queue", "billing", "--type", "t", "--payload", "b")
	for _, tc := range []struct {
		line string
		want []string
	}{
		{"asyncctl ", []string{":words", "completion", "dashboard", "dead", "enqueue", "help", "job", "jobs", "migrate", "pause", "queues", "relay", "resume", "schedules", "top", "workers", "workflow"}},
		{"asyncctl workflow ", []string{":words", "cancel", "show"}},
		{"asyncctl de", []string{":words", "dead"}},
		{"asyncctl dead ", []string{":words", "list", "pop", "purge", "redrive", "show"}},
		{"asyncctl -v dead re", []string{":words", "redrive"}},
		{"asyncctl help dead p", []string{":words", "pop", "purge"}},
		{"asyncctl dead list --re", []string{":words", "--reason"}},
		{"asyncctl queues --", []string{":words", "--json", "--queue", "--url"}},
		{"asyncctl dead list --reason po", []string{":words", "poisoned"}},
		{"asyncctl dead list --reason=pa", []string{":words", "payload_missing"}},
		{"asyncctl jobs --state re", []string{":words", "retrying"}},
		{"asyncctl --url " + url + " queues ", []string{":words", "billing", "emails"}},
		{"asyncctl --url=" + url + " top e", []string{":words", "emails"}},
		{"asyncctl dead list --url " + url + " --queue b", []string{":words", "billing"}},
		{"asyncctl dead list --url '" + url + "' --queue=", []string{":words", "billing", "emails"}},
		{"asyncctl dead show --url " + url + " --queue emails ", []string{":words", jobs[0].ID}},
		{"asyncctl dead show --url " + url + " ", []string{":words"}}, // "default" has none
		{"asyncctl enqueue --from ", []string{":files"}},
		{"asyncctl enqueue --file=", []string{":files"}},
		{"asyncctl completion ", []string{":words", "bash", "fish", "zsh"}},
		{"asyncctl completion bash ", []string{":words"}},
		{"asyncctl --url nope://x queues ", []string{":words"}}, // no backend: nothing, quietly
	} {
		if got := completions(t, "bash", tc.line); !slices.Equal(got, tc.want) {
			t.Errorf("bash %q: %q, want %q", tc.line, got, tc.want)
		}
	}
	// zsh and fish give the words; fish wants no directive.
	if got := completions(t, "zsh", "--url", url, "queues", "--queue=b"); !slices.Equal(got, []string{":words", "billing"}) {
		t.Errorf("zsh: %q", got)
	}
	if got := completions(t, "fish", "asyncctl", "dead", "pu"); !slices.Equal(got, []string{"purge"}) {
		t.Errorf("fish: %q", got)
	}
	if got := completions(t, "fish", "asyncctl", "q"); !slices.Equal(got, []string{"queues"}) {
		t.Errorf("fish: %q", got)
	}
	for _, shell := range []string{"bash", "zsh", "fish"} {
		if out := mustCtl(t, exitOK, "", "completion", shell); !strings.Contains(out, "__complete "+shell) {
			t.Errorf("completion %s:\n%s", shell, out)
		}
	}
	mustCtl(t, exitUsage, "", "completion", "tcsh")
}

func TestSplitLine(t *testing.T) {
	t.Parallel()
	for line, want := range map[string][]string{
		"":                       {""},
		"a b ":                   {"a", "b", ""},
		`a  'b c' "d\"e" f\ g`:   {"a", "b c", `d"e`, "f g"},
		`a --queue='em`:          {"a", "--queue=em"},
		"asyncctl\tdead\tlist":   {"asyncctl", "dead", "list"},
		`x "unterminated \$HOME`: {"x", "unterminated $HOME"},
	} {
		if got := splitLine(line); !slices.Equal(got, want) {
			t.Errorf("splitLine(%q) = %q, want %q", line, got, want)
		}
	}
}

// Completion in real interactive shells, typed in a terminal: a command,
// a flag and a queue name from the backend, each with one Tab.
func TestCompletionInShells(t *testing.T) {
	t.Parallel()
	rawURL := prefixedRedis(t)
	bin := binary(t)
	deleteAfter(t, rawURL, "billing")
	mustExe(t, rawURL, exitOK, "", "enqueue", "--queue", "billing", "--type", "t", "--payload", "x")
	env := fmt.Sprintf("PATH=%s:$PATH ASYNCPLATFORM_URL=%s", shell(filepath.Dir(bin)), shell(rawURL))
	for _, sh := range []struct{ name, start, setup string }{
		{"bash", "bash --norc --noprofile -i", "source <(asyncctl completion bash)"},
		{"zsh", "zsh -f -i", "autoload -Uz compinit && compinit -u && source <(asyncctl completion zsh)"},
	} {
		t.Run(sh.name, func(t *testing.T) {
			t.Parallel()
			testenv.Tool(t, sh.name)
			x := newTmux(t, env+" "+sh.start)
			x.keys(sh.setup, "Enter")
			x.keys("echo ready", "Enter")
			x.waitFor("the shell", `(?m)^ready$`)
			for _, tc := range []struct{ typed, want string }{
				{"asyncctl dead li", `asyncctl dead list\s*$`},
				{"asyncctl dead list --rea", `asyncctl dead list --reason\s*$`},
				{"asyncctl queues --queue bil", `asyncctl queues --queue billing\s*$`},
				{"asyncctl top bi", `asyncctl top billing\s*$`},
			} {
				x.keys(tc.typed, "Tab")
				x.waitFor(fmt.Sprintf("%q completed", tc.typed), `(?m)`+tc.want)
				x.keys("C-u")
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
}

// TestReasonsEverywhere ties --reason (its check and its help), its
// completion and both READMEs to ap.Reasons.
func TestReasonsEverywhere(t *testing.T) {
	t.Parallel()
	help := mustCtl(t, exitOK, "", "dead", "list", "--help")
	completed := completions(t, "bash", "asyncctl dead list --reason ")
	var readmes []string
	for _, path := range []string{"README.md", "../../README.md"} {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		readmes = append(readmes, string(b))
	}
	url := memURL(t)
	for _, r := range ap.Reasons() {
		name := string(r)
		if !strings.Contains(help, name) {
			t.Errorf("dead list --help does not name %s", name)
		}
		if !slices.Contains(completed, name) {
			t.Errorf("--reason completes %q, without %s", completed, name)
		}
		for i, s := range readmes {
			if !strings.Contains(s, "`"+name+"`") {
				t.Errorf("README %d does not name `%s`", i, name)
			}
		}
		// Accepted by --reason: nothing matches (exit 3), no usage error.
		mustCtl(t, exitNotFound, "", "dead", "list", "--url", url, "--queue", "q", "--reason", name)
	}
}
