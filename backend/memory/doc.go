// Package memory is an in-process asyncplatform backend: complete, fast and
// safe for concurrent use. It is the embedded default for demos and for
// users' own tests.
//
//	b, err := memory.New(ctx, memory.Config{})
//	p, err := asyncplatform.New(b, asyncplatform.Config{})
//
// # URLs
//
// Importing the package registers the memory scheme for asyncplatform.Open:
//
//	memory://           the broker named "default"
//	memory://name       the broker named name
//
// Brokers opened by URL live as long as the process, by name: every
// memory://a opens a new connection to one broker, and memory://b is
// another. The URL takes no parameters.
//
// # Layout
//
// A Broker holds the queues; a Backend is one connection to it. New returns a
// connection to Config.Broker, or to a private broker of its own when that is
// nil. To model several worker processes sharing one broker, make a Broker
// with NewBroker and connect once per "process" (New with Config.Broker, or
// Broker.Connect): closing a connection is exactly a crash of that process.
// Its unsettled deliveries are returned at once with the delivery counted
// (Capabilities.RedeliversOnClose), so a test can exercise poison handling:
//
//	broker := memory.NewBroker()
//	worker := broker.Connect() // this one will "crash"
//	...
//	worker.Close()             // the job comes back with Crashes+1
//
// Each queue keeps a FIFO of ready messages, a heap of scheduled ones (by
// NotBefore, then arrival) and a heap of lease deadlines. Every method holds
// the broker's lock for its whole step, so no step is ever half done.
// An idle Receive waits for a signal from whatever makes a message ready (an
// Enqueue, a Requeue, a released delivery) or for a timer set to the
// earliest due time or lease deadline: it never polls.
//
// # Counting
//
// Deliveries are counted at claim time, under the broker's lock, together with
// the lease (a token and a deadline). Every settle checks the token, so a
// stale delivery gets driver.ErrLeaseLost. Leases that run out are returned
// by the next Receive (or the wake-up it sets for the earliest deadline).
// Requeue stores a new copy, whose count starts again at zero.
//
// # Dead letters
//
// Each queue keeps its records in a list, oldest first. NextDead hands out
// the oldest record nobody holds, under a token; SettleDead removes it or
// releases it in place, and fails with driver.ErrLeaseLost when the token
// moved on. A closed connection releases the records it held at once. A
// hold lasts until then, or, with Config.DeadHold set, for DeadHold after
// NextDead or the last ExtendDead (Capabilities.DeadHold reports it).
// ListDead's cursor is an index into the list (a page may repeat or skip a
// record when records are removed between pages), and it lists held records
// too. DeleteDead leaves held records alone; PurgeDead removes them as well,
// and their holders' SettleDead then fails.
//
// # Limits
//
// Priorities within a queue (Job.Priority with QueueConfig.Priorities) are a
// queue per level, here three more in-process queues per queue, and a
// waiting Receive on each empty level (a goroutine on a condition, no
// polling).
//
// Nothing persists: a process exit loses everything. No message size limit
// and no minimum lease. Queues and records live in the process's memory,
// with no bound but that.
//
// Browse (driver.Browser) lists a queue's ready, scheduled and in-flight
// messages under the broker's lock, paged by position, copying each body.
//
// # Clusters
//
// None: a Broker lives in one process, and every worker of a queue must be
// a connection to that Broker in that process. There is no replication, no
// failover and nothing that survives the process.
package memory
