// Package dashboard is a web dashboard for an asyncplatform Platform: an
// http.Handler that a program mounts in its own HTTP server, as it mounts
// package health, and that "asyncctl dashboard" runs standalone on any
// backend URL.
//
//	d, err := dashboard.New(p, dashboard.Config{Prefix: "/jobs", Queues: []string{"emails", "billing"}})
//	mux.Handle("/jobs/", requireAdmin(d)) // your own authentication in front of it
//
// Everything it serves is inside the binary (go:embed): templates, one style
// sheet and one small script. It loads nothing from elsewhere and needs no
// build step.
//
// # Pages
//
//   - the queue list: every queue with its depths (ready, scheduled, in
//     flight, dead), marked when it is paused, with its paused groups and
//     the jobs each holds (a group's held queue is not listed as a queue),
//     and small charts of the last ten minutes: attempts (succeeded and
//     failed) per interval, with a Recorder, captioned with the jobs
//     dead-lettered among those that ended (an attempt to be retried is no
//     failed job) and the rate of the last minute, and the depths sampled
//     at each view;
//   - a queue: its depths and charts, whether it is paused and its paused
//     groups with the jobs each holds, its dead letters filtered by type,
//     reason, age and text, paged with a cursor without any limit on how far
//     (the filters are applied while paging, so a page is filled even when
//     the matches are far apart), and the actions;
//   - one dead letter in full, addressed by the record's ID or its job's (a
//     record's own ID wins: "v.1" is job v's copy 1 before job "v.1"): the payload as JSON, text or hex (and as a
//     download; the page shows at most its first 256 KiB, and JSON nested
//     deeper than 64 levels or over 512 KiB once indented is shown as
//     text, saying why), the headers, the last error with its stack, the error
//     history, the worker, the counters, and the raw bytes of a record that
//     was not a job;
//   - jobs (/jobs, of one queue with ?q=): the jobs of the queues that track
//     status, from their status records, with their counts by state (at
//     most ap.MaxCountScan records read, "partial" past it), filtered by
//     state and type and paged by cursor (each page reads at most
//     ap.MaxJobsScan records); for one queue that the dashboard's platform
//     does not track and a state the broker holds (waiting, scheduled,
//     retrying, running), the queue's messages read from the broker
//     without consuming them, where the backend can (ap.SourceAuto;
//     ?source=broker or ?source=status chooses), and the page says which;
//   - one job (/job?id=): its status by job ID: state and reason, tries,
//     failures and crashes, the last error, the result's size, the times,
//     the worker, and a link to its dead letter when it is dead-lettered;
//   - schedules (/schedules): every schedule some process has run on the
//     backend (Platform.Schedules), with its spec, job type and queue,
//     catch-up, last and next tick, and who started it when (at most
//     MaxSchedulesShown rows).
//
// # Actions
//
// Pop the oldest dead letter (the page shows what was popped), redrive one,
// redrive every dead letter matching the current filter, delete one or every
// one matching the filter (with Config.Deleter), purge the dead-letter queue
// after typing its name, and enqueue a job. Acting on a filter asks first,
// with the number of records it matches.
//
// Pause a queue and resume it (Platform.Pause, Resume), pause a group of its
// jobs by name and resume a paused group (Platform.PauseGroup, ResumeGroup):
// the page says how many held jobs the resume moved back. These take one
// click: they lose nothing and are undone by the other button. A group's
// resume waits a couple of seconds for the workers to notice, and goes on
// if the browser leaves meanwhile. A backend without a store cannot pause:
// the page says so and offers neither.
//
// # Safe by default
//
// Dead-letter records hold whatever a writer to the broker put there, so
// every value from a record or a job is escaped for its context by
// html/template, and control, bidi and zero-width characters are shown as
// escapes (\x1b, \u202e) rather than sent to the page; so is a group's
// name, read from the store. A state change is a
// POST with a CSRF token bound to a cookie (and a cross-origin request is
// refused before the token is looked at); a GET never changes anything.
// Config.ReadOnly refuses every action (and shows the pause states
// without their buttons). Config.Authorize is called before
// every request with its action, so the host decides who may view and who
// may act. Every page is sent with a strict Content-Security-Policy: no
// inline script or style, and the one script is loaded with a per-response
// nonce.
//
// The dashboard authenticates no one: mount it behind the host's own
// authentication, or fill in Config.Authorize.
//
// # Charts
//
// Depths are sampled in-process: each view of a page records the depths it
// read, one sample per interval, so the depth charts cover the times the
// dashboard was looked at (a page can refresh itself every ten seconds). A
// Recorder counts attempts as they happen when the workers' platform is
// given its AfterAttempt as Hooks.AfterAttempt; without one, the attempts
// charts say so.
//
// # Queues
//
// The queue list shows every queue the backend holds (Platform.Queues), with
// the age of its oldest dead letter, and the queues of Config.Queues it does
// not hold yet; a backend that cannot list its queues shows Config.Queues
// alone. Any other valid queue can be opened by name; its page says so
// when the backend does not hold it (Platform.CheckKnownQueue), rather than
// show an empty queue without a word.
package dashboard
