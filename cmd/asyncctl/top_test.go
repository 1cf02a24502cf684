package main

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	tea "github.com/charmbracelet/bubbletea"

	ap "github.com/asyncplatform/asyncplatform"
)

// top's view marks a paused queue after its name, a long name cut to
// maxQueueWidth first; a queue whose figures could not be read is not
// marked, and p pauses the view's refreshing, which the header says
// without the word that marks queues alone.
func TestTopMarksPausedQueues(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("q", 60)
	m := &topModel{redact: func(s string) string { return s }, url: "memory://", interval: time.Second, prev: map[string][]topSample{}}
	m.update([]ap.QueueInfo{
		{Name: "billing", QueueStats: ap.QueueStats{Ready: 5, Paused: true}},
		{Name: "emails", QueueStats: ap.QueueStats{Ready: 2}},
		{Name: long, QueueStats: ap.QueueStats{Paused: true}},
		{Name: "broken", QueueStats: ap.QueueStats{Paused: true}, Err: errors.New("stats failed")},
	}, time.Now())
	view := m.View()
	for _, re := range []string{
		`(?m)^billing \(paused\)\s+5\s`,
		`(?m)^emails\s+2\s`,
		`(?m)^` + strings.Repeat("q", maxQueueWidth-1) + `… \(paused\)\s+0\s`,
		`(?m)^broken\s+-\s`,
	} {
		if !regexp.MustCompile(re).MatchString(view) {
			t.Errorf("the view does not match %s:\n%s", re, view)
		}
	}
	if n := strings.Count(view, "(paused)"); n != 2 {
		t.Errorf("%d queues marked paused, want 2:\n%s", n, view)
	}
	m.Update(tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune("p")})
	if view := m.View(); !strings.Contains(view, " · refresh paused · ") {
		t.Errorf("after p, the header does not say the refreshing is paused:\n%s", view)
	}
}

// top's header counts its queues in English: "1 queue", "2 queues".
func TestTopHeaderCountsQueues(t *testing.T) {
	t.Parallel()
	m := &topModel{redact: func(s string) string { return s }, url: "memory://", interval: time.Second, prev: map[string][]topSample{}}
	m.update([]ap.QueueInfo{{Name: "emails"}}, time.Now())
	if view := m.View(); !strings.Contains(view, " · 1 queue · ") {
		t.Errorf("one queue:\n%s", view)
	}
	m.update([]ap.QueueInfo{{Name: "emails"}, {Name: "billing"}}, time.Now())
	if view := m.View(); !strings.Contains(view, " · 2 queues · ") {
		t.Errorf("two queues:\n%s", view)
	}
}

// top shows each queue's attempts of the last five minutes from the
// history, and n/a when there is none to read.
func TestTopRecentHistory(t *testing.T) {
	t.Parallel()
	m := &topModel{redact: func(s string) string { return s }, url: "memory://", interval: time.Second, prev: map[string][]topSample{},
		history: func(context.Context, time.Time) ([]ap.HistoryMinute, error) {
			return []ap.HistoryMinute{
				{Series: []ap.HistorySeries{{Queue: "emails", Type: "a", Succeeded: 7, Failed: 2}}},
				{Series: []ap.HistorySeries{{Queue: "emails", Type: "b", Succeeded: 5, DeadLettered: 1}}},
			}, nil
		}}
	m.update([]ap.QueueInfo{{Name: "emails"}, {Name: "billing"}}, time.Now())
	m.recent = m.readRecent(context.Background())
	view := m.View()
	for _, re := range []string{`(?m)^emails(\s+\d+){4}\s+12\s+3$`, `(?m)^billing(\s+\d+){4}\s+0\s+0$`, `OK/5m\s+FAILED/5m`} {
		if !regexp.MustCompile(re).MatchString(view) {
			t.Errorf("the view does not match %s:\n%s", re, view)
		}
	}
	m.history = func(context.Context, time.Time) ([]ap.HistoryMinute, error) { return nil, ap.ErrNoStore }
	m.recent = m.readRecent(context.Background())
	if view := m.View(); !regexp.MustCompile(`(?m)^emails(\s+\d+){4}\s+n/a\s+n/a$`).MatchString(view) {
		t.Errorf("without a history, the view does not say n/a:\n%s", view)
	}
}
