package conformance_test

import (
	"fmt"

	"github.com/asyncplatform/asyncplatform/conformance"
)

// The suite's cases, grouped by the part of the contract they prove. A
// failing case shows as TestConformance/<name> in the backend's test.
func ExampleCases() {
	for _, name := range conformance.Cases() {
		fmt.Println(name)
	}
	// Output:
	// RoundTrip/AllFields
	// RoundTrip/Payloads
	// RoundTrip/PayloadLimit
	// Payload/Offload10MiB
	// Payload/OffloadBoundary
	// Payload/OffloadMissing
	// Payload/OffloadLifecycle
	// TryCount/CountsUp
	// Retry/DefaultLimit
	// Retry/Precedence
	// Retry/BackoffRespected
	// Outcome/Invalid
	// Outcome/Permanent
	// Outcome/Reject
	// Outcome/Panic
	// Outcome/Timeout
	// Outcome/Unhandled
	// Outcome/UnhandledThenHandled
	// Outcome/Expired
	// Outcome/ForeignBytes
	// Crash/Redelivered
	// Crash/RetryLimitZeroSurvivesCrash
	// Crash/Poison
	// Crash/PoisonLimitPerType
	// Crash/PoisonIsolation
	// Crash/ProcessKill
	// Lease/ExtendedForSlowHandler
	// Lease/StaleReceiptRefused
	// Lease/LapsedReceiptRefused
	// Lease/LapsesOnTime
	// Lease/ExtendLate
	// Lease/HeldWholeBatch
	// Lease/SettlesRedelivered
	// DeadLetter/Empty
	// DeadLetter/PopKeepError
	// DeadLetter/ConcurrentCallers
	// DeadLetter/ListingLeavesQueue
	// DeadLetter/Redrive
	// DeadLetter/Purge
	// DeadLetter/DeleteLeavesHeld
	// DeadLetter/HeldForSlowCallback
	// DeadLetter/ExtendDeadLate
	// DeadLetter/OldestFreeFirst
	// DeadLetter/HeldForDeadHold
	// Stop/HandsBackUncounted
	// Stop/FinishesRunning
	// Delivery/ExactlyOnceWithoutFaults
	// Delivery/NotBeforeNotEarly
	// Delivery/NotBeforeOnTime
	// Delivery/NotBeforeRace
	// Delivery/ReceiveBatch
	// Delivery/WakesOnEnqueue
	// Delivery/CancelledReceiveUncounted
	// Close/ErrClosed
	// Close/AbandonsDeliveries
	// Close/ReleasesDeadLetterHolds
	// Close/ReleasesEveryHold
	// Stats/Depths
	// Stats/LapsedAndDue
	// Stats/OldestReady
	// Browse/LeavesQueue
	// Browse/LapsedIsReady
	// Flow/Pause
	// Flow/StrictOrder
	// Flow/Weighted
	// Flow/PriorityWithinQueue
	// Flow/PauseGroup
	// Flow/PauseGroupSignedLevels
	// Flow/ClusterConcurrency
	// Flow/RateLimit
	// Outcomes/StatusWalk
	// Outcomes/ResultJSON
	// Outcomes/StatusAfterStop
	// Outcomes/CancelWaiting
	// Outcomes/CancelRunning
	// Outcomes/CancelFailsBeforePoll
	// Outcomes/OutputOnePerJob
	// Outcomes/OutputSurvivesKill
	// Unique/ConcurrentEnqueue
	// Unique/FreeAfterSuccess
	// Unique/FreeAfterDeadLetter
	// Unique/FreeAfterWindow
	// Unique/ConcurrentProcesses
	// Unique/BatchPartlyHeld
	// Schedule/OnePerTick
	// Schedule/OnePerTickProcesses
	// Schedule/RestartSkipsMissed
	// Schedule/RestartCatchesUp
	// Workflow/Chain
	// Workflow/Diamond
	// Workflow/FanIn
	// Workflow/DependencyFailedRedrive
	// Workflow/Cancel
	// Workflow/BatchOnSuccess
}
