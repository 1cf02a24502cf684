package main

import (
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

// writeJSON prints v as indented JSON.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("writing JSON: %w", err)
	}
	return nil
}

// json1 prints v as JSON on one line.
func json1(w io.Writer, v any) error {
	if err := json.NewEncoder(w).Encode(v); err != nil {
		return fmt.Errorf("writing JSON: %w", err)
	}
	return nil
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

// shorten returns the first line of s, cut to n runes.
func shorten(s string, n int) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
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
		rows[i] = []string{dl.Job.ID, dl.Job.Type, string(dl.Reason), strconv.Itoa(dl.Job.TryCount), age(now, dl.DeadAt) + " ago", shorten(dl.Error, 60)}
	}
	return rows
}

// maxShown bounds the payload bytes printed by dead show and dead pop.
const maxShown = 4096

// printDead prints one dead letter in full, for people.
func printDead(w io.Writer, now time.Time, dl ap.DeadLetter) {
	j := dl.Job
	fmt.Fprintf(w, "ID:        %s\n", j.ID)
	fmt.Fprintf(w, "Type:      %s\n", j.Type)
	fmt.Fprintf(w, "Queue:     %s\n", dl.Queue)
	fmt.Fprintf(w, "Reason:    %s\n", dl.Reason)
	fmt.Fprintf(w, "Tries:     %d (failures %d, crashes %d)\n", j.TryCount, j.Failures, j.Crashes)
	if !j.EnqueuedAt.IsZero() {
		fmt.Fprintf(w, "Enqueued:  %s (%s ago)\n", j.EnqueuedAt.UTC().Format(time.RFC3339), age(now, j.EnqueuedAt))
	}
	fmt.Fprintf(w, "Dead:      %s (%s ago) on %s\n", dl.DeadAt.UTC().Format(time.RFC3339), age(now, dl.DeadAt), dl.Worker)
	if len(j.Headers) > 0 {
		keys := make([]string, 0, len(j.Headers))
		for k := range j.Headers {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		fmt.Fprintf(w, "Headers:\n")
		for _, k := range keys {
			fmt.Fprintf(w, "  %s: %s\n", k, j.Headers[k])
		}
	}
	if dl.Raw != nil {
		fmt.Fprintf(w, "Raw:       %d bytes (the message was not a job)\n", len(dl.Raw))
		printBytes(w, dl.Raw)
	} else {
		fmt.Fprintf(w, "Payload:   %d bytes\n", len(j.Payload))
		printBytes(w, j.Payload)
	}
	fmt.Fprintf(w, "Error:\n%s\n", indent(dl.Error))
	if len(j.Errors) > 0 {
		fmt.Fprintf(w, "History:\n%s\n", indent(strings.Join(j.Errors, "\n")))
	}
}

func printBytes(w io.Writer, b []byte) {
	if len(b) == 0 {
		return
	}
	cut := b[:min(len(b), maxShown)]
	if isText(b) {
		fmt.Fprintln(w, indent(string(cut)))
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
