package reference

// Mutation names one rule of the driver contract that a Broker breaks.
type Mutation string

// The mutations. Each breaks one rule, as a backend author might by
// mistake; Mutations says which rule and which cases catch it. A blunt
// mutation breaks its rule everywhere; its partial twins (listed after the
// blunt ones) break it only where the platform never goes, or only in part:
// late in a lease, for a second holder, for an unchanged value, in a short
// window.
const (
	// Leases and settles.
	LateSettle   Mutation = "LateSettle"   // a settle after the lease ran out is accepted while nobody else took the job
	StaleSettle  Mutation = "StaleSettle"  // a stale receipt acts on a newer delivery of its job
	ExtendNoop   Mutation = "ExtendNoop"   // Extend renews nothing
	ShortLease   Mutation = "ShortLease"   // a lease lasts a quarter of what was asked
	NoTimers     Mutation = "NoTimers"     // an idle Receive wakes for a lapsed lease or a due NotBefore only by chance (a 3 s fallback)
	AckKeeps     Mutation = "AckKeeps"     // Ack leaves the message, to come back after its lease
	SlowBodies   Mutation = "SlowBodies"   // a Receive's answer travels at 1 MiB/s, so MaxBody takes two leases
	BodyAltered  Mutation = "BodyAltered"  // Receive drops the last byte of every body
	NoTooLarge   Mutation = "NoTooLarge"   // Enqueue accepts bodies over MaxBody
	OverMax      Mutation = "OverMax"      // Receive hands out more than max
	EmptyAtOnce  Mutation = "EmptyAtOnce"  // Receive on an empty queue returns nothing at once instead of blocking
	Polling      Mutation = "Polling"      // an idle Receive looks again every second instead of being woken
	SharedQueues Mutation = "SharedQueues" // every queue name is the same queue
	DeclareOnce  Mutation = "DeclareOnce"  // Declare of an existing queue fails

	// Counting and copies.
	NoCount                Mutation = "NoCount"                // Deliveries is always 1
	CountFromZero          Mutation = "CountFromZero"          // Deliveries is 0 on a first delivery
	CancelledClaimsLost    Mutation = "CancelledClaimsLost"    // a claim whose Receive's ctx ended on its way back is left leased
	CancelledClaimsCounted Mutation = "CancelledClaimsCounted" // such a claim is put back, counted
	NotBeforeIgnored       Mutation = "NotBeforeIgnored"       // NotBefore is ignored
	BatchKeepsFirst        Mutation = "BatchKeepsFirst"        // Enqueue stores the first message of a batch only
	RequeueKeepsCount      Mutation = "RequeueKeepsCount"      // a Requeue's copy carries on the old copy's count
	RequeueNow             Mutation = "RequeueNow"             // a Requeue's copy ignores its NotBefore
	RequeueDrops           Mutation = "RequeueDrops"           // Requeue settles the old copy and stores no new one
	DeadLetterKeeps        Mutation = "DeadLetterKeeps"        // DeadLetter writes the record and leaves the message leased

	// Close.
	NoErrClosed          Mutation = "NoErrClosed"          // methods go on working after Close
	CloseTwiceFails      Mutation = "CloseTwiceFails"      // a second Close returns an error
	CloseKeepsLeases     Mutation = "CloseKeepsLeases"     // Close leaves its deliveries leased (RedeliversOnClose notwithstanding)
	CloseLosesDeliveries Mutation = "CloseLosesDeliveries" // Close drops its unsettled deliveries for good
	CloseKeepsHolds      Mutation = "CloseKeepsHolds"      // Close keeps its dead-letter holds: the records stay hidden for good

	// Dead letters and Stats.
	NextDeadShares  Mutation = "NextDeadShares"  // NextDead hands out records another caller holds
	ExtendDeadNoop  Mutation = "ExtendDeadNoop"  // ExtendDead renews nothing
	DeadHoldShort   Mutation = "DeadHoldShort"   // a dead-letter hold lasts a quarter of Capabilities.DeadHold
	NextDeadNewest  Mutation = "NextDeadNewest"  // NextDead hands out the newest record first
	KeepDeletes     Mutation = "KeepDeletes"     // SettleDead(keep) deletes the record
	KeepMovesToBack Mutation = "KeepMovesToBack" // SettleDead(keep) puts the record at the back
	ListNoCursor    Mutation = "ListNoCursor"    // ListDead ignores its cursor
	ListOverLimit   Mutation = "ListOverLimit"   // ListDead returns more than limit
	ListReorders    Mutation = "ListReorders"    // ListDead moves the records it lists to the back
	DeleteHeld      Mutation = "DeleteHeld"      // DeleteDead deletes (and counts) records another caller holds
	DeleteMiscounts Mutation = "DeleteMiscounts" // DeleteDead returns 0
	PurgeMiscounts  Mutation = "PurgeMiscounts"  // PurgeDead returns 0
	StatsZero       Mutation = "StatsZero"       // Stats returns zeros

	// Partial twins of the blunt mutations above.
	LateAckOnly            Mutation = "LateAckOnly"            // twin of LateSettle: only a late Ack is accepted
	StaleExtendOnly        Mutation = "StaleExtendOnly"        // twin of StaleSettle: only a stale Extend acts on the newer delivery
	ExtendLateNoop         Mutation = "ExtendLateNoop"         // twin of ExtendNoop: an Extend in the last tenth of the lease renews nothing
	OverMaxByOne           Mutation = "OverMaxByOne"           // twin of OverMax: Receive hands out max+1 when it can
	NotBeforeWindow        Mutation = "NotBeforeWindow"        // twin of NotBeforeIgnored: a Receive landing within EarlyWindow of a NotBefore takes the message early
	CloseLosesLater        Mutation = "CloseLosesLater"        // twin of CloseLosesDeliveries: Close hands back its first unsettled delivery and drops the others
	NoErrClosedStats       Mutation = "NoErrClosedStats"       // twin of NoErrClosed: Stats alone goes on working after Close
	CloseKeepsLaterHolds   Mutation = "CloseKeepsLaterHolds"   // twin of CloseKeepsHolds: Close releases its first hold only
	CloseKeepsSecondHolder Mutation = "CloseKeepsSecondHolder" // twin of CloseKeepsHolds: only the first connection that ever held a record has its holds released by Close
	ExtendDeadLateNoop     Mutation = "ExtendDeadLateNoop"     // twin of ExtendDeadNoop: an ExtendDead in the last tenth of the hold renews nothing
	ListOverLimitByOne     Mutation = "ListOverLimitByOne"     // twin of ListOverLimit: ListDead returns limit+1
	StatsLapseStale        Mutation = "StatsLapseStale"        // twin of StatsZero: a lapsed lease counts as InFlight until a Receive takes it back
	StatsDueStale          Mutation = "StatsDueStale"          // twin of StatsZero: a due message counts as Scheduled until a Receive looks

	ShortLeaseInBatch             Mutation = "ShortLeaseInBatch"             // twin of ShortLease: every delivery of a batch but the first is leased for a quarter
	NoLapseTimer                  Mutation = "NoLapseTimer"                  // twin of NoTimers: an idle Receive wakes for a due NotBefore, but for a lapsed lease only by chance
	AckKeepsRedelivered           Mutation = "AckKeepsRedelivered"           // twin of AckKeeps: an Ack of a delivery counted more than once leaves the message
	SlowLargeBodies               Mutation = "SlowLargeBodies"               // twin of SlowBodies: only bodies of half MaxBody or more travel at 1 MiB/s
	BodyAlteredBinary             Mutation = "BodyAlteredBinary"             // twin of BodyAltered: bytes that are not UTF-8 come back replaced, as through a text field
	NoTooLargeInBatch             Mutation = "NoTooLargeInBatch"             // twin of NoTooLarge: only the first message of a batch is checked against MaxBody
	EmptyAfterWake                Mutation = "EmptyAfterWake"                // twin of EmptyAtOnce: a Receive woken to find nothing (a rival took the message) returns nothing at once
	PollingAfterIdle              Mutation = "PollingAfterIdle"              // twin of Polling: a Receive idle for longer than IdleAfter stops being woken and looks again every second
	SharedDeadLetters             Mutation = "SharedDeadLetters"             // twin of SharedQueues: the queues keep their messages apart, but share one dead-letter queue
	DeclareNonEmptyFails          Mutation = "DeclareNonEmptyFails"          // twin of DeclareOnce: Declare of a queue that holds messages fails
	NoCountOnLapse                Mutation = "NoCountOnLapse"                // twin of NoCount: a delivery whose lease lapsed comes back uncounted
	RequeueCountsFromZero         Mutation = "RequeueCountsFromZero"         // twin of CountFromZero: a Requeue's copy counts 0 on its first delivery
	CancelledClaimsLostInBatch    Mutation = "CancelledClaimsLostInBatch"    // twin of CancelledClaimsLost: of a cancelled batch, only the first claim is put back
	CancelledClaimsCountedInBatch Mutation = "CancelledClaimsCountedInBatch" // twin of CancelledClaimsCounted: of a cancelled batch, the claims after the first are put back counted
	BatchCapped                   Mutation = "BatchCapped"                   // twin of BatchKeepsFirst: Enqueue stores the first BatchCap messages of a batch only
	RequeueNowKeepsCount          Mutation = "RequeueNowKeepsCount"          // twin of RequeueKeepsCount: a Requeue with no NotBefore keeps the old copy's count (a nack)
	RequeueShortNow               Mutation = "RequeueShortNow"               // twin of RequeueNow: a Requeue's NotBefore under a second away is rounded down to now
	RequeueDropsDelayed           Mutation = "RequeueDropsDelayed"           // twin of RequeueDrops: a Requeue's copy with a NotBefore ahead is dropped
	DeadLetterKeepsRedelivered    Mutation = "DeadLetterKeepsRedelivered"    // twin of DeadLetterKeeps: a DeadLetter of a delivery counted more than once leaves the message leased
	CloseTwiceErrClosed           Mutation = "CloseTwiceErrClosed"           // twin of CloseTwiceFails: a second Close returns driver.ErrClosed
	CloseKeepsLaterLeases         Mutation = "CloseKeepsLaterLeases"         // twin of CloseKeepsLeases: Close hands back its first delivery at once and leaves the others leased
	NextDeadSharesSameConn        Mutation = "NextDeadSharesSameConn"        // twin of NextDeadShares: a connection's NextDead hands out records that connection holds
	DeadHoldEarly                 Mutation = "DeadHoldEarly"                 // twin of DeadHoldShort: a hold lasts three quarters of DeadHold
	NextDeadSkipsToNewest         Mutation = "NextDeadSkipsToNewest"         // twin of NextDeadNewest: when the oldest record is held, NextDead hands out the newest free one
	KeepDeletesExtended           Mutation = "KeepDeletesExtended"           // twin of KeepDeletes: SettleDead(keep) of a record whose hold was renewed deletes it
	KeepMovesBackOne              Mutation = "KeepMovesBackOne"              // twin of KeepMovesToBack: SettleDead(keep) swaps the record with the one after it
	ListCursorSkips               Mutation = "ListCursorSkips"               // twin of ListNoCursor: a page from a cursor skips one record
	ListReordersWhole             Mutation = "ListReordersWhole"             // twin of ListReorders: a listing whose page is the whole queue moves the oldest record to the back
	DeleteHeldCounted             Mutation = "DeleteHeldCounted"             // twin of DeleteHeld: DeleteDead leaves held records alone but counts them
	DeleteCountsAbsent            Mutation = "DeleteCountsAbsent"            // twin of DeleteMiscounts: DeleteDead counts the IDs it was given that are not there
	PurgeCountsLastPage           Mutation = "PurgeCountsLastPage"           // twin of PurgeMiscounts: PurgeDead removes in pages of two and returns the last page's count

	OldestReadyEnqueued Mutation = "OldestReadyEnqueued" // Stats.OldestReady is the enqueue, even of a job that came due or whose lease lapsed later

	BrowseCounts         Mutation = "BrowseCounts"         // Browse counts a delivery of every message it lists
	BrowseCursorRepeats  Mutation = "BrowseCursorRepeats"  // Browse's next cursor starts at its page's last message
	BrowseLapsedInFlight Mutation = "BrowseLapsedInFlight" // Browse lists a message whose lease lapsed as in flight until a Receive
)

// Entry is one mutation with the rule it breaks and the cases that must
// catch it.
type Entry struct {
	Mutation Mutation
	Rule     string   // the rule broken, in the contract's words
	Cases    []string // the conformance cases expected to fail (at least one must)
}

// Mutations lists every mutation, grouped as docs/contract.md groups the
// rules.
var Mutations = []Entry{
	{LateSettle, "Ack, Extend, Requeue and DeadLetter return ErrLeaseLost once the lease has run out, even before the job is handed out again",
		[]string{"Lease/LapsedReceiptRefused"}},
	{StaleSettle, "a stale receipt never acts on a newer delivery of the same job",
		[]string{"Lease/StaleReceiptRefused"}},
	{ExtendNoop, "Extend renews the lease",
		[]string{"Lease/ExtendedForSlowHandler"}},
	{ShortLease, "a delivery is held for the lease Receive was given",
		[]string{"Lease/ExtendedForSlowHandler", "Lease/LapsesOnTime"}},
	{NoTimers, "a lapsed lease and a due NotBefore make the message deliverable on time, with no other traffic on the queue",
		[]string{"Lease/LapsesOnTime", "Delivery/NotBeforeOnTime"}},
	{AckKeeps, "Ack removes the message for good",
		[]string{"Delivery/ExactlyOnceWithoutFaults"}},
	{SlowBodies, "a body of MaxBody bytes reaches the platform well within the lease, which runs from the claim",
		[]string{"RoundTrip/PayloadLimit"}},
	{BodyAltered, "Receive hands back exactly the bytes Enqueue was given",
		[]string{"RoundTrip/Payloads", "RoundTrip/PayloadLimit", "Delivery/ReceiveBatch"}},
	{NoTooLarge, "Enqueue refuses a body over Capabilities.MaxBody with ErrTooLarge",
		[]string{"RoundTrip/PayloadLimit"}},
	{OverMax, "Receive hands out at most max messages",
		[]string{"Delivery/ReceiveBatch"}},
	{EmptyAtOnce, "Receive blocks until a message is available or its ctx ends, and then returns ctx.Err()",
		[]string{"Delivery/ReceiveBatch", "Lease/StaleReceiptRefused"}},
	{Polling, "an idle Receive takes new work at once: woken by the broker, or polling every few tens of milliseconds",
		[]string{"Delivery/WakesOnEnqueue"}},
	{SharedQueues, "queues are separate: each has its own messages and dead letters",
		[]string{"Retry/Precedence"}},
	{DeclareOnce, "Declare is idempotent",
		[]string{"Delivery/ExactlyOnceWithoutFaults", "Crash/Redelivered"}},

	{NoCount, "Deliveries counts every hand-out of a copy, so a delivery that ended without an outcome is a crash",
		[]string{"Crash/Redelivered", "Lease/StaleReceiptRefused", "Lease/LapsesOnTime"}},
	{CountFromZero, "Deliveries is 1 on a copy's first delivery",
		[]string{"Delivery/ReceiveBatch", "Crash/Redelivered"}},
	{CancelledClaimsLost, "messages Receive took but did not hand out (its ctx ended) are put back at once",
		[]string{"Delivery/CancelledReceiveUncounted"}},
	{CancelledClaimsCounted, "messages Receive took but did not hand out are put back without counting a delivery",
		[]string{"Delivery/CancelledReceiveUncounted"}},
	{NotBeforeIgnored, "a message is never delivered before its NotBefore",
		[]string{"Delivery/NotBeforeNotEarly", "Delivery/NotBeforeOnTime", "Retry/BackoffRespected"}},
	{BatchKeepsFirst, "Enqueue stores every message it is given",
		[]string{"Delivery/ReceiveBatch", "Delivery/ExactlyOnceWithoutFaults"}},
	{RequeueKeepsCount, "a Requeue's copy starts its delivery count again",
		[]string{"Outcome/Reject", "Stop/HandsBackUncounted", "Delivery/NotBeforeOnTime"}},
	{RequeueNow, "a Requeue's copy is not delivered before its NotBefore",
		[]string{"Retry/BackoffRespected", "Delivery/NotBeforeOnTime"}},
	{RequeueDrops, "Requeue stores the new copy",
		[]string{"TryCount/CountsUp", "Outcome/Reject"}},
	{DeadLetterKeeps, "DeadLetter settles the delivery",
		[]string{"Outcome/Invalid", "Outcome/Permanent"}},

	{NoErrClosed, "every method returns ErrClosed after Close",
		[]string{"Close/ErrClosed", "Crash/Poison"}},
	{CloseTwiceFails, "Close is idempotent",
		[]string{"Close/ErrClosed"}},
	{CloseKeepsLeases, "with Capabilities.RedeliversOnClose, Close hands its unsettled deliveries back at once",
		[]string{"Close/AbandonsDeliveries"}},
	{CloseLosesDeliveries, "Close abandons unsettled deliveries: they come back, one more delivery counted",
		[]string{"Close/AbandonsDeliveries", "Crash/Redelivered"}},
	{CloseKeepsHolds, "a dead letter held by a caller that closes (or dies) becomes visible again",
		[]string{"Close/ReleasesDeadLetterHolds"}},

	{NextDeadShares, "NextDead hides the record it hands out from other callers until SettleDead",
		[]string{"DeadLetter/ConcurrentCallers"}},
	{ExtendDeadNoop, "ExtendDead renews the hold for another Capabilities.DeadHold",
		[]string{"DeadLetter/HeldForSlowCallback"}},
	{DeadHoldShort, "a dead letter handed out by NextDead stays held for Capabilities.DeadHold",
		[]string{"DeadLetter/HeldForSlowCallback"}},
	{NextDeadNewest, "NextDead hands out the oldest record",
		[]string{"DeadLetter/PopKeepError", "DeadLetter/ListingLeavesQueue"}},
	{KeepDeletes, "SettleDead(keep) leaves the record",
		[]string{"DeadLetter/PopKeepError"}},
	{KeepMovesToBack, "SettleDead(keep) puts the record back where it was",
		[]string{"DeadLetter/PopKeepError"}},
	{ListNoCursor, "ListDead pages from its cursor",
		[]string{"DeadLetter/ListingLeavesQueue"}},
	{ListOverLimit, "ListDead returns at most limit records",
		[]string{"DeadLetter/ListingLeavesQueue"}},
	{ListReorders, "ListDead changes nothing: neither the order nor the count",
		[]string{"DeadLetter/ListingLeavesQueue"}},
	{DeleteHeld, "DeleteDead leaves records held by a NextDead caller alone, and does not count them",
		[]string{"DeadLetter/DeleteLeavesHeld"}},
	{DeleteMiscounts, "DeleteDead returns how many records it removed",
		[]string{"DeadLetter/DeleteLeavesHeld", "Payload/OffloadLifecycle"}},
	{PurgeMiscounts, "PurgeDead returns how many records it removed",
		[]string{"DeadLetter/Purge"}},
	{StatsZero, "Stats reports the queue's depths (-1 for a figure the backend cannot tell)",
		[]string{"Stats/Depths"}},

	{LateAckOnly, "Ack returns ErrLeaseLost once the lease has run out, like the other settling calls",
		[]string{"Lease/LapsedReceiptRefused"}},
	{StaleExtendOnly, "a stale receipt's Extend never renews a newer delivery of the same job",
		[]string{"Lease/StaleReceiptRefused"}},
	{ExtendLateNoop, "Extend renews the lease however late in it it comes, its last tenth included",
		[]string{"Lease/ExtendLate"}},
	{OverMaxByOne, "Receive hands out at most max messages, not one more",
		[]string{"Delivery/ReceiveBatch"}},
	{NotBeforeWindow, "a message is never delivered before its NotBefore, not even to a Receive that lands just before it",
		[]string{"Delivery/NotBeforeRace"}},
	{CloseLosesLater, "Close abandons every unsettled delivery of the backend: each comes back, one more delivery counted",
		[]string{"Close/AbandonsDeliveries"}},
	{NoErrClosedStats, "every method returns ErrClosed after Close, Stats included",
		[]string{"Close/ErrClosed"}},
	{CloseKeepsLaterHolds, "Close releases every dead-letter hold of the backend, not only its first",
		[]string{"Close/ReleasesEveryHold"}},
	{CloseKeepsSecondHolder, "Close releases the dead-letter holds of every backend that closes, not only those of the first holder",
		[]string{"Close/ReleasesEveryHold"}},
	{ExtendDeadLateNoop, "ExtendDead renews the hold however late in it it comes, its last tenth included",
		[]string{"DeadLetter/ExtendDeadLate"}},
	{ListOverLimitByOne, "ListDead returns at most limit records, not one more",
		[]string{"DeadLetter/ListingLeavesQueue"}},
	{StatsLapseStale, "Stats counts a message whose lease lapsed as Ready (deliverable now), with no Receive needed",
		[]string{"Stats/LapsedAndDue"}},
	{StatsDueStale, "Stats counts a message whose NotBefore has passed as Ready (deliverable now), with no Receive needed",
		[]string{"Stats/LapsedAndDue"}},
	{ShortLeaseInBatch, "a delivery is held for the lease Receive was given, every delivery of a batch",
		[]string{"Lease/HeldWholeBatch"}},
	{NoLapseTimer, "a lapsed lease makes the message deliverable on time, with no other traffic on the queue",
		[]string{"Lease/LapsesOnTime"}},
	{AckKeepsRedelivered, "Ack removes the message for good, a redelivered one too",
		[]string{"Crash/Redelivered"}},
	{SlowLargeBodies, "a body of MaxBody bytes reaches the platform well within the lease, which runs from the claim",
		[]string{"RoundTrip/PayloadLimit"}},
	{BodyAlteredBinary, "Receive hands back exactly the bytes Enqueue was given, bytes that are not text included",
		[]string{"Delivery/ReceiveBatch", "RoundTrip/Payloads"}},
	{NoTooLargeInBatch, "Enqueue refuses a body over Capabilities.MaxBody with ErrTooLarge, wherever it is in the batch",
		[]string{"RoundTrip/PayloadLimit"}},
	{EmptyAfterWake, "Receive blocks until a message is available or its ctx ends, even when a rival takes the message it woke for",
		[]string{"Delivery/NotBeforeOnTime"}},
	{PollingAfterIdle, "an idle Receive takes new work at once however long it has waited",
		[]string{"Delivery/WakesOnEnqueue"}},
	{SharedDeadLetters, "queues are separate: each has its own dead letters",
		[]string{"Retry/Precedence"}},
	{DeclareNonEmptyFails, "Declare is idempotent, on a queue that holds messages too",
		[]string{"Crash/Redelivered"}},
	{NoCountOnLapse, "Deliveries counts every hand-out of a copy, the one after a lapsed lease too",
		[]string{"Lease/LapsesOnTime", "Lease/LapsedReceiptRefused"}},
	{RequeueCountsFromZero, "Deliveries is 1 on the first delivery of a Requeue's copy",
		[]string{"Delivery/NotBeforeOnTime"}},
	{CancelledClaimsLostInBatch, "every message of a batch Receive took but did not hand out is put back at once",
		[]string{"Delivery/CancelledReceiveUncounted"}},
	{CancelledClaimsCountedInBatch, "every message of a batch Receive took but did not hand out is put back without counting a delivery",
		[]string{"Delivery/CancelledReceiveUncounted"}},
	{BatchCapped, "Enqueue stores every message it is given, however many",
		[]string{"Delivery/ReceiveBatch", "Delivery/ExactlyOnceWithoutFaults"}},
	{RequeueNowKeepsCount, "a Requeue's copy starts its delivery count again, one deliverable at once too",
		[]string{"Stop/HandsBackUncounted", "Outcome/Reject"}},
	{RequeueShortNow, "a Requeue's copy is not delivered before its NotBefore, one under a second away too",
		[]string{"Delivery/NotBeforeOnTime", "Retry/BackoffRespected"}},
	{RequeueDropsDelayed, "Requeue stores the new copy, a delayed one too",
		[]string{"Delivery/NotBeforeOnTime", "Retry/BackoffRespected"}},
	{DeadLetterKeepsRedelivered, "DeadLetter settles the delivery, a redelivered one too",
		[]string{"Lease/SettlesRedelivered"}},
	{CloseTwiceErrClosed, "Close is idempotent: a second Close returns nil",
		[]string{"Close/ErrClosed"}},
	{CloseKeepsLaterLeases, "with Capabilities.RedeliversOnClose, Close hands every unsettled delivery back at once",
		[]string{"Close/AbandonsDeliveries"}},
	{NextDeadSharesSameConn, "NextDead hides the record it hands out until SettleDead, from other callers of the same connection too",
		[]string{"DeadLetter/ConcurrentCallers"}},
	{DeadHoldEarly, "a dead letter handed out by NextDead stays held for the whole of Capabilities.DeadHold",
		[]string{"DeadLetter/HeldForDeadHold"}},
	{NextDeadSkipsToNewest, "NextDead hands out the oldest record no other caller holds",
		[]string{"DeadLetter/OldestFreeFirst"}},
	{KeepDeletesExtended, "SettleDead(keep) leaves the record, after an ExtendDead too",
		[]string{"DeadLetter/ExtendDeadLate"}},
	{KeepMovesBackOne, "SettleDead(keep) puts the record back exactly where it was",
		[]string{"DeadLetter/PopKeepError"}},
	{ListCursorSkips, "ListDead pages from its cursor, the record after it first",
		[]string{"DeadLetter/ListingLeavesQueue"}},
	{ListReordersWhole, "ListDead changes nothing, a listing of the whole queue in one page too",
		[]string{"DeadLetter/ListingLeavesQueue"}},
	{DeleteHeldCounted, "DeleteDead does not count the held records it leaves alone",
		[]string{"DeadLetter/DeleteLeavesHeld"}},
	{DeleteCountsAbsent, "DeleteDead returns how many records it removed, not how many IDs it was given",
		[]string{"DeadLetter/DeleteLeavesHeld"}},
	{PurgeCountsLastPage, "PurgeDead returns how many records it removed, all of them",
		[]string{"DeadLetter/Purge"}},
	{OldestReadyEnqueued, "Stats.OldestReady is when the oldest ready job became deliverable: its NotBefore, or the lapse of its lease, not its enqueue",
		[]string{"Stats/OldestReady"}},
	{BrowseCounts, "Browse changes nothing: no delivery is counted",
		[]string{"Browse/LeavesQueue"}},
	{BrowseCursorRepeats, "paging Browse by its cursor lists every message of the state once",
		[]string{"Browse/LeavesQueue"}},
	{BrowseLapsedInFlight, "a message whose lease lapsed is ready, to Browse too, with no Receive needed",
		[]string{"Browse/LapsedIsReady"}},
}
