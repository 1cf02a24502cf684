package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"
)

func completionCmd() *command {
	return &command{
		name:    "completion",
		noJSON:  true,
		args:    "bash|zsh|fish",
		summary: "print the shell completion script: commands, flags and queue names",
		help: `
It prints a script that makes the shell complete asyncctl's commands, their
flags, the reasons of --reason, and queue names (for --queue and the
queues and top commands) and dead-letter IDs (for dead show and dead
redrive), which it asks the backend of --url or $ASYNCPLATFORM_URL for,
as you type (within two seconds, or not at all).

Examples:

	source <(asyncctl completion bash)      # in ~/.bashrc
	source <(asyncctl completion zsh)       # in ~/.zshrc, after compinit
	asyncctl completion fish > ~/.config/fish/completions/asyncctl.fish
`,
		setup: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
			return func(ctx context.Context, c *cli, args []string) error {
				if len(args) != 1 {
					return usageErrorf("name the shell: bash, zsh or fish")
				}
				script, ok := completionScripts[args[0]]
				if !ok {
					return usageErrorf("no completion for %q: bash, zsh or fish", args[0])
				}
				_, err := io.WriteString(c.stdout, script)
				return err
			}
		},
	}
}

// The scripts call "asyncctl __complete SHELL ..." for the candidates: one
// a line, after a first line that is ":files" when the shell should
// complete file names instead, else ":words".
var completionScripts = map[string]string{
	"bash": `# bash completion for asyncctl: source <(asyncctl completion bash)
_asyncctl() {
	local IFS=$'\n'
	local -a out
	out=($("${COMP_WORDS[0]}" __complete bash "${COMP_LINE:0:COMP_POINT}" 2>/dev/null))
	if [[ ${out[0]} == :files ]]; then
		compopt -o default 2>/dev/null
		COMPREPLY=()
		return
	fi
	COMPREPLY=("${out[@]:1}")
}
complete -F _asyncctl asyncctl
`,
	"zsh": `#compdef asyncctl
# zsh completion for asyncctl: source <(asyncctl completion zsh), after compinit
_asyncctl() {
	local -a out
	out=("${(@f)$(${words[1]} __complete zsh "${(@)words[2,CURRENT]}" 2>/dev/null)}")
	if [[ ${out[1]} == :files ]]; then
		_files
		return
	fi
	out=("${(@)out[2,-1]}")
	if [[ $PREFIX == -*=* ]]; then
		compset -P '*='
	fi
	(( ${#out} )) && compadd -a out
}
compdef _asyncctl asyncctl
`,
	"fish": `# fish completion for asyncctl: asyncctl completion fish > ~/.config/fish/completions/asyncctl.fish
complete -c asyncctl -f -a '(asyncctl __complete fish (commandline -cop) (commandline -ct))'
`,
}

// completeTimeout bounds what completion asks the backend.
const completeTimeout = 2 * time.Second

// complete answers a completion script: the shell, then the words typed
// before the cursor, the last one the word being completed. bash gives the
// line, which complete splits; fish the words from the program's name on;
// zsh the words after it.
func (c *cli) complete(ctx context.Context, args []string) int {
	if len(args) < 1 {
		return exitUsage
	}
	shell, words := args[0], args[1:]
	if shell == "bash" {
		if len(words) != 1 {
			return exitUsage
		}
		words = splitLine(words[0])
	}
	if (shell == "bash" || shell == "fish") && len(words) > 0 {
		words = words[1:] // the program
	}
	if len(words) == 0 {
		words = []string{""}
	}
	files, cands := c.candidates(ctx, words[:len(words)-1], words[len(words)-1])
	if shell != "fish" {
		if files {
			fmt.Fprintln(c.stdout, ":files")
			return exitOK
		}
		fmt.Fprintln(c.stdout, ":words")
	}
	for _, s := range cands {
		fmt.Fprintln(c.stdout, s)
	}
	return exitOK
}

// candidates returns the completions of cur after the words before it, or
// files when the shell should complete a file name.
func (c *cli) candidates(ctx context.Context, before []string, cur string) (files bool, out []string) {
	cmds := commands()
	// Walk the words: global and command flags with their values, the
	// command's name, its arguments.
	var (
		cmd     *command
		fs      = flag.NewFlagSet("", flag.ContinueOnError)
		name    []string // the command's words so far
		pending *flag.Flag
	)
	c.commonFlags(fs)
	lookup := func(arg string) (*flag.Flag, bool) { // the flag of "--name" or "--name=value", and whether it has its value
		n, _, hasValue := strings.Cut(strings.TrimLeft(arg, "-"), "=")
		return fs.Lookup(n), hasValue
	}
	for _, w := range before {
		switch {
		case pending != nil:
			_ = fs.Set(pending.Name, w)
			pending = nil
		case w == "--":
		case strings.HasPrefix(w, "-") && len(w) > 1:
			f, hasValue := lookup(w)
			if f != nil && !hasValue && !isBool(f) {
				pending = f
			} else if f != nil && hasValue {
				_, v, _ := strings.Cut(w, "=")
				_ = fs.Set(f.Name, v)
			}
		case cmd == nil:
			name = append(name, w)
			if found, _ := find(cmds, name); found != nil {
				cmd = found
				found.setup(fs) // its flags too
			}
		}
	}
	prefix := cur
	values := func(flagName string) (bool, []string) {
		switch flagName {
		case "queue":
			return false, c.queueNames(ctx)
		case "reason":
			return false, reasonNames()
		case "state":
			return false, jobStateNames()
		case "source":
			return false, []string{"broker", "status"}
		case "file", "from":
			return true, nil
		case "url", "type", "payload", "id", "header", "cursor":
			return false, nil
		}
		return false, nil
	}
	switch {
	case pending != nil:
		files, out = values(pending.Name)
	case strings.HasPrefix(cur, "-") && strings.Contains(cur, "="):
		f, _ := lookup(cur)
		_, prefix, _ = strings.Cut(cur, "=")
		if f == nil {
			return false, nil
		}
		files, out = values(f.Name)
	case strings.HasPrefix(cur, "-"):
		fs.VisitAll(func(f *flag.Flag) {
			if len(f.Name) == 1 {
				out = append(out, "-"+f.Name)
			} else {
				out = append(out, "--"+f.Name)
			}
		})
	case cmd == nil:
		out = nextWords(cmds, name)
	case cmd.name == "completion":
		if len(before) == 0 || !slices.Contains([]string{"bash", "zsh", "fish"}, before[len(before)-1]) {
			out = []string{"bash", "fish", "zsh"}
		}
	case cmd.name == "queues" || cmd.name == "top":
		out = c.queueNames(ctx)
	case cmd.name == "dead show" || cmd.name == "dead redrive":
		q := fs.Lookup("queue").Value.String()
		out = c.deadIDs(ctx, q)
	}
	if files {
		return true, nil
	}
	var kept []string
	for _, s := range out {
		if strings.HasPrefix(s, prefix) {
			kept = append(kept, s)
		}
	}
	sort.Strings(kept)
	return false, slices.Compact(kept)
}

// nextWords are the words that may follow name (the words typed) towards
// a command: "queues", "dead"; after "dead": "list", "show", ...; after
// "help": every first word.
func nextWords(cmds []*command, name []string) []string {
	if len(name) > 0 && name[0] == "help" {
		name = name[1:]
	}
	var out []string
	for _, cmd := range append(cmds, &command{name: "help"}) {
		words := strings.Fields(cmd.name)
		if len(words) > len(name) && slices.Equal(words[:len(name)], name) {
			out = append(out, words[len(name)])
		}
	}
	return out
}

func isBool(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// queueNames asks the backend for its queues, briefly; none on any error.
func (c *cli) queueNames(ctx context.Context) []string {
	ctx, cancel := context.WithTimeout(ctx, completeTimeout)
	defer cancel()
	p, closeFn, err := c.open(ctx)
	if err != nil {
		return nil
	}
	defer closeFn()
	names, _ := p.QueueNames(ctx)
	return names
}

// deadIDs returns the job IDs of the first dead letters of the queue.
func (c *cli) deadIDs(ctx context.Context, queue string) []string {
	if checkQueue("", queue) != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, completeTimeout)
	defer cancel()
	p, closeFn, err := c.open(ctx)
	if err != nil {
		return nil
	}
	defer closeFn()
	page, err := p.DeadLetters(ctx, queue, "", 200)
	if err != nil {
		return nil
	}
	var ids []string
	for _, dl := range page.Letters {
		if id := dl.Job.ID; id != "" && field(id) == id && !strings.ContainsAny(id, " '\"\\$`") {
			ids = append(ids, id) // only IDs a shell takes as they are
		}
	}
	return ids
}

// splitLine splits a shell command line into words, as far as completion
// needs: blanks separate words, quotes and backslashes quote. An
// unfinished last word (the one being completed) is kept, "" when the line
// ends in a blank.
func splitLine(line string) []string {
	var words []string
	var w strings.Builder
	in := false // in a word
	var quote byte
	for i := 0; i < len(line); i++ {
		ch := line[i]
		switch {
		case quote == '\'':
			if ch == '\'' {
				quote = 0
			} else {
				w.WriteByte(ch)
			}
		case quote == '"':
			switch {
			case ch == '"':
				quote = 0
			case ch == '\\' && i+1 < len(line) && strings.IndexByte("\"\\$`", line[i+1]) >= 0:
				i++
				w.WriteByte(line[i])
			default:
				w.WriteByte(ch)
			}
		case ch == '\'' || ch == '"':
			quote, in = ch, true
		case ch == '\\' && i+1 < len(line):
			i++
			w.WriteByte(line[i])
			in = true
		case ch == ' ' || ch == '\t' || ch == '\n':
			if in {
				words = append(words, w.String())
				w.Reset()
				in = false
			}
		default:
			w.WriteByte(ch)
			in = true
		}
	}
	return append(words, w.String())
}
