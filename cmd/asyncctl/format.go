package main

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/driver"
)

func schemes() []string { return driver.Schemes() }

// redactSecrets replaces the secrets of the backend URL raw (see secrets)
// in s, longest first so that no part of one is left.
func redactSecrets(s, raw string) string {
	secs := secrets(raw)
	sort.Slice(secs, func(i, j int) bool { return len(secs[i]) > len(secs[j]) })
	for _, sec := range secs {
		if len(sec) >= 3 {
			s = strings.ReplaceAll(s, sec, "xxxxx")
		}
	}
	return s
}

// writeJSON prints v as indented JSON, with every character a terminal
// might act on escaped (see jsonSafe).
func writeJSON(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("writing JSON: %w", err)
	}
	if _, err := w.Write(append(jsonSafe(b), '\n')); err != nil {
		return fmt.Errorf("writing JSON: %w", err)
	}
	return nil
}

// json1 prints v as JSON on one line, escaped as writeJSON does.
func json1(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("writing JSON: %w", err)
	}
	if _, err := w.Write(append(jsonSafe(b), '\n')); err != nil {
		return fmt.Errorf("writing JSON: %w", err)
	}
	return nil
}

// jsonSafe escapes, in JSON that encoding/json wrote, the characters it
// leaves as they are but a terminal may act on: DEL, the C1 controls
// (U+0080 to U+009F: U+009B is CSI to some terminals) and Unicode format
// characters (bidirectional overrides, zero-width ones). encoding/json
// already escapes the C0 controls, U+2028 and U+2029, and writes invalid
// UTF-8 as U+FFFD. Outside strings JSON is ASCII, so every such character
// is in a string, where \uXXXX means the same.
func jsonSafe(b []byte) []byte {
	if !bytes.ContainsFunc(b, unsafeInJSON) {
		return b
	}
	out := make([]byte, 0, len(b)+64)
	for _, r := range string(b) {
		if !unsafeInJSON(r) {
			out = utf8.AppendRune(out, r)
			continue
		}
		if r1, r2 := utf16.EncodeRune(r); r1 != utf8.RuneError {
			out = fmt.Appendf(out, "\\u%04x\\u%04x", r1, r2)
		} else {
			out = fmt.Appendf(out, "\\u%04x", r)
		}
	}
	return out
}

func unsafeInJSON(r rune) bool {
	return r == 0x7f || 0x80 <= r && r <= 0x9f || unicode.Is(unicode.Cf, r)
}

// Text printed for people from a message or a dead-letter record (IDs,
// types, reasons, errors, worker names, headers, payload text) goes through
// field or block, so that no escape sequence reaches the terminal and no
// newline forges a line: a control character (C0, DEL, C1), an invalid
// UTF-8 byte or any other character that is not printable (a bidirectional
// override, a zero-width character) is shown as an escape in the manner of
// strconv.Quote: \n, \t, \r, \x1b, \u009b, \u202e.

// field escapes s for a one-line field: a newline or tab is escaped too.
func field(s string) string { return escape(s, false) }

// block escapes s for a multi-line block: it keeps newlines and tabs.
func block(s string) string { return escape(s, true) }

func escape(s string, lines bool) string {
	clean := true
	for _, r := range s {
		if r == utf8.RuneError || r != ' ' && !strconv.IsPrint(r) && !(lines && (r == '\n' || r == '\t')) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size <= 1:
			fmt.Fprintf(&b, "\\x%02x", s[i])
		case lines && (r == '\n' || r == '\t'), r == ' ', strconv.IsPrint(r):
			b.WriteString(s[i : i+size])
		default:
			q := strconv.QuoteRuneToASCII(r) // '\n', '\x1b', '\u009b'
			b.WriteString(q[1 : len(q)-1])
		}
		i += size
	}
	return b.String()
}

// table prints rows under a header, in aligned columns.
func table(w io.Writer, header []string, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("writing the table: %w", err)
	}
	return nil
}

// count prints a depth, "-" where the backend cannot tell (-1).
func count(n int64) string {
	if n < 0 {
		return "-"
	}
	return strconv.FormatInt(n, 10)
}

// age prints how long ago t was, coarsely: 42s, 5m, 3h, 2d.
func age(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", max(int(d.Seconds()), 0))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	default:
		return fmt.Sprintf("%dd", int(d.Hours()/24))
	}
}

// readyAge says how long the oldest ready job of s has waited at now, as
// age does; none when no job is ready, "unknown" when the backend cannot
// tell since when.
func readyAge(now time.Time, s ap.QueueStats, none string) string {
	if _, ok := s.ReadyAge(now); !ok {
		return "unknown"
	}
	if s.OldestReady.IsZero() {
		return none
	}
	return age(now, s.OldestReady)
}

// shorten returns the first line of s, escaped (field), cut to n runes.
func shorten(s string, n int) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	s = field(s)
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// deadJSON is a dead letter as --json prints it. Payload and Raw are base64,
// as encoding/json prints bytes; PayloadText repeats the payload when it is
// text.
type deadJSON struct {
	ID          string            `json:"id"`
	Type        string            `json:"type"`
	Queue       string            `json:"queue"`
	Reason      string            `json:"reason"`
	Error       string            `json:"error"`
	DeadAt      time.Time         `json:"dead_at"`
	Worker      string            `json:"worker"`
	TryCount    int               `json:"try_count"`
	Failures    int               `json:"failures"`
	Crashes     int               `json:"crashes"`
	EnqueuedAt  time.Time         `json:"enqueued_at"`
	Headers     map[string]string `json:"headers,omitempty"`
	Payload     []byte            `json:"payload"`
	PayloadText *string           `json:"payload_text,omitempty"`
	Errors      []string          `json:"errors,omitempty"`
	Raw         []byte            `json:"raw,omitempty"`
}

func toJSON(dl ap.DeadLetter) deadJSON {
	d := deadJSON{
		ID: dl.Job.ID, Type: dl.Job.Type, Queue: dl.Queue, Reason: string(dl.Reason), Error: dl.Error,
		DeadAt: dl.DeadAt, Worker: dl.Worker, TryCount: dl.Job.TryCount, Failures: dl.Job.Failures,
		Crashes: dl.Job.Crashes, EnqueuedAt: dl.Job.EnqueuedAt, Headers: dl.Job.Headers,
		Payload: dl.Job.Payload, Errors: dl.Job.Errors, Raw: dl.Raw,
	}
	if d.Payload == nil {
		d.Payload = []byte{}
	}
	if isText(dl.Job.Payload) {
		s := string(dl.Job.Payload)
		d.PayloadText = &s
	}
	return d
}

func isText(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, r := range string(b) {
		if !unicode.IsPrint(r) && !unicode.IsSpace(r) {
			return false
		}
	}
	return true
}

// deadRows are dead letters as table rows, under deadHeader.
var deadHeader = []string{"ID", "TYPE", "REASON", "TRIES", "DEAD", "ERROR"}

func deadRows(now time.Time, dls []ap.DeadLetter) [][]string {
	rows := make([][]string, len(dls))
	for i, dl := range dls {
		rows[i] = []string{field(dl.Job.ID), field(dl.Job.Type), field(string(dl.Reason)), strconv.Itoa(dl.Job.TryCount), age(now, dl.DeadAt) + " ago", shorten(dl.Error, 60)}
	}
	return rows
}

// maxShown bounds the payload bytes printed by dead show and dead pop.
const maxShown = 4096

// printDead prints one dead letter in full, for people.
func printDead(w io.Writer, now time.Time, dl ap.DeadLetter) {
	j := dl.Job
	fmt.Fprintf(w, "ID:        %s\n", field(j.ID))
	fmt.Fprintf(w, "Type:      %s\n", field(j.Type))
	fmt.Fprintf(w, "Queue:     %s\n", field(dl.Queue))
	fmt.Fprintf(w, "Reason:    %s\n", field(string(dl.Reason)))
	fmt.Fprintf(w, "Tries:     %d (failures %d, crashes %d)\n", j.TryCount, j.Failures, j.Crashes)
	if !j.EnqueuedAt.IsZero() {
		fmt.Fprintf(w, "Enqueued:  %s (%s ago)\n", j.EnqueuedAt.UTC().Format(time.RFC3339), age(now, j.EnqueuedAt))
	}
	fmt.Fprintf(w, "Dead:      %s (%s ago) on %s\n", dl.DeadAt.UTC().Format(time.RFC3339), age(now, dl.DeadAt), field(dl.Worker))
	if len(j.Headers) > 0 {
		keys := make([]string, 0, len(j.Headers))
		for k := range j.Headers {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		fmt.Fprintf(w, "Headers:\n")
		for _, k := range keys {
			fmt.Fprintf(w, "  %s: %s\n", field(k), field(j.Headers[k]))
		}
	}
	if dl.Raw != nil {
		fmt.Fprintf(w, "Raw:       %d bytes (the message was not a job)\n", len(dl.Raw))
		printBytes(w, dl.Raw)
	} else {
		fmt.Fprintf(w, "Payload:   %d bytes\n", len(j.Payload))
		printBytes(w, j.Payload)
	}
	fmt.Fprintf(w, "Error:\n%s\n", indent(block(dl.Error)))
	if len(j.Errors) > 0 {
		lines := make([]string, len(j.Errors))
		for i, e := range j.Errors {
			lines[i] = field(e) // one line each: a newline in one would pass for the next
		}
		fmt.Fprintf(w, "History:\n%s\n", indent(strings.Join(lines, "\n")))
	}
}

func printBytes(w io.Writer, b []byte) {
	if len(b) == 0 {
		return
	}
	cut := b[:min(len(b), maxShown)]
	if isText(b) {
		fmt.Fprintln(w, indent(block(string(cut))))
	} else {
		fmt.Fprint(w, hex.Dump(cut))
	}
	if len(cut) < len(b) {
		fmt.Fprintf(w, "  … %d more bytes (--json prints them all)\n", len(b)-len(cut))
	}
}

func indent(s string) string {
	return "  " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n  ")
}

// plural is n and the noun, with an "s" unless n is 1: "1 queue", "3 queues".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}

// fields is field of each string.
func fields(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = field(s)
	}
	return out
}

// pluralWord is the noun, with an "s" unless n is 1.
func pluralWord(n int, noun string) string {
	if n == 1 {
		return noun
	}
	return noun + "s"
}
