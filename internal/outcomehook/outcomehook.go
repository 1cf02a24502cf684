// Package outcomehook lets the conformance suite stop a worker process at
// one point of the platform's pipeline: after an outcome report is
// published to a queue's output queue and before the job's own message is
// settled. The suite's child process sets Published and blocks in it until
// the parent kills it (Outcomes/OutputSurvivesKill). It is nil in every
// other program, and the platform then does nothing more than one atomic
// load per report.
package outcomehook

import "sync/atomic"

// Published, when set, is called with the input job's queue and ID once
// its outcome report is stored, before the input is acknowledged or
// dead-lettered.
var Published atomic.Pointer[func(queue, id string)]
