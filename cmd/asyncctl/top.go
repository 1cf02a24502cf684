package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	tea "github.com/charmbracelet/bubbletea"
	"golang.org/x/term"

	ap "github.com/asyncplatform/asyncplatform"
)

func topCmd() *command {
	return &command{
		name:    "top",
		noJSON:  true,
		args:    "[QUEUE...]",
		summary: "a live view of every queue: depths, their change per second, the oldest dead letter",
		help: `
It shows every queue the backend holds (or only the queues named) and
refreshes in place every --interval: the depths, how fast the pending jobs
(ready, scheduled and in flight) and the dead letters grow or shrink
(PENDING/s and DEAD/s, the change per second over the last ten refreshes,
at least 5s: a draining queue has a negative PENDING/s, a failing one a
positive DEAD/s),
the attempts that ended in the last five minutes (OK/5m: succeeded;
FAILED/5m: failed or dead-lettered), from the history the workers keep
in the store ("n/a" without one), and the age of the oldest dead letter.
OLDEST READY is how long the oldest ready job has waited since it became
deliverable ("unknown" where the backend cannot tell).
A paused queue (asyncctl pause) is
marked "(paused)" after its name. The broker keeps no count of jobs
done, so these are net changes: the platform's metrics (package otel)
count jobs processed and failed.

Keys: q (or Ctrl-C) quits, s sorts by name, dead letters or ready jobs in
turn, p pauses the refreshing (not the queues), r refreshes now. It needs
a terminal; for scripts, use "asyncctl queues --json". A queue named that
the backend does not hold is refused as unknown (exit code 3).

Examples:

	asyncctl top
	asyncctl top --interval 5s
	asyncctl top emails billing
`,
		setup: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
			var interval time.Duration
			fs.DurationVar(&interval, "interval", time.Second, "refresh every `DURATION`")
			return func(ctx context.Context, c *cli, args []string) error {
				if interval < 100*time.Millisecond {
					return usageErrorf("--interval must be 100ms or more")
				}
				for _, q := range args {
					if err := checkQueue("", q); err != nil {
						return err
					}
				}
				if c.json {
					return usageErrorf("top is for people: for JSON, use asyncctl queues --json")
				}
				return c.top(ctx, args, interval)
			}
		},
	}
}

func (c *cli) top(ctx context.Context, names []string, interval time.Duration) error {
	p, closeFn, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer closeFn()
	if err := checkKnown(ctx, p, names, ""); err != nil {
		return err
	}
	out, ok := c.stdout.(*os.File)
	if !ok || !term.IsTerminal(int(out.Fd())) {
		return usageErrorf("top needs a terminal; for scripts, use asyncctl queues (--json)")
	}
	m := &topModel{
		fetch: func(ctx context.Context) ([]ap.QueueInfo, error) {
			return queueInfos(ctx, p, names)
		},
		history:  p.History,
		redact:   c.redact,
		url:      redactURL(c.url),
		interval: interval,
		prev:     map[string][]topSample{},
	}
	var in io.Reader = os.Stdin
	if f, ok := c.stdin.(*os.File); ok {
		in = f
	}
	prog := tea.NewProgram(m, tea.WithContext(ctx), tea.WithAltScreen(), tea.WithInput(in), tea.WithOutput(c.stdout))
	_, err = prog.Run()
	if errors.Is(err, tea.ErrProgramKilled) && ctx.Err() != nil {
		return nil // SIGTERM
	}
	return err
}

// topModel is the live view: a bubbletea model.
type topModel struct {
	fetch    func(context.Context) ([]ap.QueueInfo, error)
	history  func(ctx context.Context, since time.Time) ([]ap.HistoryMinute, error) // nil: no history
	redact   func(string) string
	url      string
	interval time.Duration

	width, height int
	rows          []topRow
	recent        map[string][2]int64    // each queue's attempts of the last topRecent: succeeded, failed or dead-lettered; nil: unknown
	prev          map[string][]topSample // each queue's samples over the rate window, oldest first
	at            time.Time              // of the rows
	err           error                  // of the last refresh
	sortBy        int                    // an index into topSorts
	paused        bool
	fetching      bool
}

// topRow is one queue of the view.
type topRow struct {
	ap.QueueInfo
	pendingRate, deadRate float64 // per second, since the previous sample
	rated                 bool    // the rates are known
}

// window is how far back the rates look: ten refreshes, at least 5s.
func (m *topModel) window() time.Duration { return max(10*m.interval, 5*time.Second) }

// topSample is what the rates of later refreshes are computed from.
type topSample struct {
	at            time.Time
	pending, dead int64 // -1 when unknown
}

type (
	topSnapshot struct {
		qs     []ap.QueueInfo
		err    error
		at     time.Time
		recent map[string][2]int64
	}
	topTick struct{}
)

// topSorts name the orders of the rows, which s cycles through.
var topSorts = []string{"name", "dead letters", "ready jobs"}

func (m *topModel) Init() tea.Cmd {
	m.fetching = true
	return m.refresh
}

// refresh reads every queue's figures, within a few intervals.
func (m *topModel) refresh() tea.Msg {
	ctx, cancel := context.WithTimeout(context.Background(), max(5*m.interval, 10*time.Second))
	defer cancel()
	qs, err := m.fetch(ctx)
	return topSnapshot{qs, err, time.Now(), m.readRecent(ctx)}
}

func (m *topModel) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case tea.WindowSizeMsg:
		m.width, m.height = msg.Width, msg.Height
	case tea.KeyMsg:
		switch msg.String() {
		case "q", "ctrl+c", "esc":
			return m, tea.Quit
		case "s":
			m.sortBy = (m.sortBy + 1) % len(topSorts)
			m.sort()
		case "p", " ":
			m.paused = !m.paused
		case "r":
			if !m.fetching {
				m.fetching = true
				return m, m.refresh
			}
		}
	case topSnapshot:
		m.fetching = false
		m.err = msg.err
		if msg.err == nil {
			m.update(msg.qs, msg.at)
			m.recent = msg.recent
		}
		return m, tea.Tick(m.interval, func(time.Time) tea.Msg { return topTick{} })
	case topTick:
		if m.paused || m.fetching {
			return m, tea.Tick(m.interval, func(time.Time) tea.Msg { return topTick{} })
		}
		m.fetching = true
		return m, m.refresh
	}
	return m, nil
}

// update makes the rows of a snapshot, with the rates since the last one.
func (m *topModel) update(qs []ap.QueueInfo, at time.Time) {
	rows := make([]topRow, len(qs))
	next := make(map[string][]topSample, len(qs))
	for i, q := range qs {
		r := topRow{QueueInfo: q}
		s := topSample{at: at, pending: -1, dead: -1}
		if q.Err == nil {
			if q.Ready >= 0 && q.Scheduled >= 0 && q.InFlight >= 0 {
				s.pending = q.Ready + q.Scheduled + q.InFlight
			} else if q.Ready >= 0 && q.Scheduled < 0 && q.InFlight < 0 {
				s.pending = q.Ready // what the backend can tell (RabbitMQ's in flight, Azure's)
			}
			s.dead = q.Dead
		}
		// The rates are over the rate window: the oldest sample kept.
		hist := m.prev[q.Name]
		for len(hist) > 1 && at.Sub(hist[1].at) >= m.window() {
			hist = hist[1:]
		}
		if len(hist) > 0 {
			p := hist[0]
			if dt := at.Sub(p.at).Seconds(); dt > 0 && s.pending >= 0 && p.pending >= 0 && s.dead >= 0 && p.dead >= 0 {
				r.pendingRate = float64(s.pending-p.pending) / dt
				r.deadRate = float64(s.dead-p.dead) / dt
				r.rated = true
			}
		}
		next[q.Name] = append(hist, s)
		rows[i] = r
	}
	m.rows, m.prev, m.at = rows, next, at
	m.sort()
}

func (m *topModel) sort() {
	sort.SliceStable(m.rows, func(i, j int) bool {
		a, b := m.rows[i], m.rows[j]
		switch m.sortBy {
		case 1:
			if a.Dead != b.Dead {
				return a.Dead > b.Dead
			}
		case 2:
			if a.Ready != b.Ready {
				return a.Ready > b.Ready
			}
		}
		return a.Name < b.Name
	})
}

// The columns of the view.
var topHeader = []string{"QUEUE", "READY", "OLDEST READY", "SCHEDULED", "IN FLIGHT", "DEAD", "PENDING/s", "DEAD/s", "OK/5m", "FAILED/5m", "OLDEST DEAD"}

// topRecent is the span of the OK and FAILED columns.
const topRecent = 5 * time.Minute

// readRecent sums the history of the last topRecent by queue; nil when
// there is none to read (no store).
func (m *topModel) readRecent(ctx context.Context) map[string][2]int64 {
	if m.history == nil {
		return nil
	}
	mins, err := m.history(ctx, time.Now().Add(-topRecent))
	if err != nil {
		return nil
	}
	out := map[string][2]int64{}
	for _, mi := range mins {
		for _, s := range mi.Series {
			c := out[s.Queue]
			c[0] += s.Succeeded
			c[1] += s.Failed + s.DeadLettered
			out[s.Queue] = c
		}
	}
	return out
}

// recentCells are a queue's OK and FAILED cells.
func (m *topModel) recentCells(queue string) (string, string) {
	if m.recent == nil {
		return "n/a", "n/a"
	}
	c := m.recent[queue]
	return count(c[0]), count(c[1])
}

// maxQueueWidth bounds the QUEUE column; a longer name is cut.
const maxQueueWidth = 40

func (m *topModel) View() string {
	var b strings.Builder
	state := "every " + m.interval.String()
	if m.paused {
		state = "refresh paused"
	}
	when := "reading…"
	if !m.at.IsZero() {
		when = m.at.Format("15:04:05")
	}
	fmt.Fprintf(&b, "asyncctl top · %s · %s · %s · %s\n", field(m.url), plural(len(m.rows), "queue"), state, when)

	now := time.Now()
	cells := [][]string{topHeader}
	var total ap.QueueStats
	for _, r := range m.rows {
		name := field(r.Name)
		if utf8.RuneCountInString(name) > maxQueueWidth {
			name = string([]rune(name)[:maxQueueWidth-1]) + "…"
		}
		if r.Err == nil && r.Paused {
			name += " (paused)"
		}
		if r.Err == nil {
			name += groupsNote(groupsJSON(r.Groups))
		}
		if r.Err != nil {
			cells = append(cells, []string{name, "-", "-", "-", "-", "-", "-", "-", "-", "-", "error"})
			continue
		}
		pr, dr := "", ""
		if r.rated {
			pr, dr = fmt.Sprintf("%+.1f", r.pendingRate), fmt.Sprintf("%+.1f", r.deadRate)
		}
		oldest := ""
		if !r.OldestDead.IsZero() {
			oldest = age(now, r.OldestDead)
		}
		ok, failed := m.recentCells(r.Name)
		cells = append(cells, []string{name, count(r.Ready), readyAge(now, r.QueueStats, ""), count(r.Scheduled), count(r.InFlight), count(r.Dead), pr, dr, ok, failed, oldest})
		total.Ready += max(r.Ready)
		total.Scheduled += max(r.Scheduled)
		total.InFlight += max(r.InFlight)
		total.Dead += max(r.Dead)
	}
	shown := len(cells)
	if limit := m.height - 6; m.height > 0 && shown > limit {
		shown = max(limit, 2)
	}
	widths := make([]int, len(topHeader))
	for _, row := range cells {
		for i, cell := range row {
			widths[i] = max(widths[i], utf8.RuneCountInString(cell))
		}
	}
	line := func(row []string) string {
		var l strings.Builder
		for i, cell := range row {
			pad := strings.Repeat(" ", widths[i]-utf8.RuneCountInString(cell))
			if i == 0 || i == len(row)-1 {
				l.WriteString(cell + pad) // text: to the left
			} else {
				l.WriteString(pad + cell) // figures: to the right
			}
			if i < len(row)-1 {
				l.WriteString("  ")
			}
		}
		return strings.TrimRight(l.String(), " ")
	}
	b.WriteString("\x1b[1m" + m.cut(line(cells[0])) + "\x1b[0m\n")
	for _, row := range cells[1:shown] {
		b.WriteString(m.cut(line(row)) + "\n")
	}
	if shown < len(cells) {
		fmt.Fprintf(&b, "… %s more (a taller terminal shows them)\n", plural(len(cells)-shown, "queue"))
	}
	if len(m.rows) > 1 {
		b.WriteString(m.cut(line([]string{"TOTAL", count(total.Ready), "", count(total.Scheduled), count(total.InFlight), count(total.Dead), "", "", "", "", ""})) + "\n")
	}
	if len(m.rows) == 0 && !m.at.IsZero() {
		b.WriteString("the backend holds no queue yet\n")
	}
	if m.err != nil {
		b.WriteString(m.cut("error: "+shorten(m.redact(m.err.Error()), 200)) + "\n")
	}
	for _, r := range m.rows {
		if r.Err != nil {
			b.WriteString(m.cut("queue "+field(r.Name)+": "+shorten(m.redact(r.Err.Error()), 200)) + "\n")
		}
	}
	b.WriteString(m.cut("\nq quit · s sort by " + topSorts[(m.sortBy+1)%len(topSorts)] + " · p pause refresh · r refresh · PENDING/s, DEAD/s: change per second"))
	return b.String()
}

// cut shortens a line to the terminal's width.
func (m *topModel) cut(s string) string {
	if m.width <= 0 || utf8.RuneCountInString(s) <= m.width {
		return s
	}
	return string([]rune(s)[:m.width])
}
