package driver

import "context"

// QueueLister is an optional interface: a backend that can name the queues
// it holds implements it, so that an operator, a dashboard or a metrics
// exporter can find every queue without being told their names.
// asyncplatform.Platform.Queues uses it, and so does asyncctl.
//
// Queues returns the names of the queues the backend holds, sorted
// (byte-wise, as sort.Strings) and without duplicates:
//
//   - every queue that holds a job (ready, scheduled or in flight) or a dead
//     letter;
//   - every queue declared with Declare, or received from, since it was last
//     removed by DeleteQueue, empty or not, as far as the broker keeps a
//     trace of that: a backend whose broker keeps none for a queue that was
//     only declared says so in its package documentation (a worker that
//     received from such a queue, or a job in it, makes it listed).
//
// A queue removed by DeleteQueue is not listed until it is declared or
// written to again. Names are read from the broker, which others can write
// to: a backend returns only names that pass CheckQueue, and the platform
// checks them again. Queues reads and changes nothing a worker depends on;
// what it costs (a key scan, a stream listing, a list of broker queues) is
// in the backend's documentation, and it may be called every few seconds by
// a live view.
type QueueLister interface {
	Queues(ctx context.Context) ([]string, error)
}
