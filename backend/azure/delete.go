package azure

import (
	"context"
	"net/http"
	"slices"
	"sync/atomic"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azqueue/queueerror"
)

// retryStatuses are the statuses the SDK's retry policy retries when
// RetryOptions.StatusCodes is nil.
var retryStatuses = []int{
	http.StatusRequestTimeout,
	http.StatusTooManyRequests,
	http.StatusInternalServerError,
	http.StatusBadGateway,
	http.StatusServiceUnavailable,
	http.StatusGatewayTimeout,
}

// watchRetries returns ctx carrying the client's retry options (opts) for
// one request, and a func that reports whether a try was retried: it ended
// with a transport error or a retried status, so the service may have
// applied it without the answer arriving. The SDK sends every try with the
// same arguments.
func watchRetries(ctx context.Context, opts policy.RetryOptions) (context.Context, func() bool) {
	var retried atomic.Bool
	codes := opts.StatusCodes
	if codes == nil {
		codes = retryStatuses
	}
	should := opts.ShouldRetry
	opts.ShouldRetry = func(resp *http.Response, err error) bool {
		var again bool
		if should != nil {
			again = should(resp, err)
		} else {
			again = err != nil || resp != nil && slices.Contains(codes, resp.StatusCode)
		}
		if again {
			retried.Store(true)
		}
		return again
	}
	return policy.WithRetryOptions(ctx, opts), retried.Load
}

// deleteMessage deletes the message with the pop receipt pop. When a try
// was retried (the service may have applied it) and a later one finds the
// message gone (MessageNotFound), it returns nil: what a delete is for is
// done, by that try of ours or, had the lease run out meanwhile, by the
// settle of the worker that received the message next. Found with another
// pop receipt (PopReceiptMismatch), the message was received again and no
// try of ours deleted it: that error is returned, as is any other.
func (r *receipt) deleteMessage(ctx context.Context, pop string) error {
	ctx, retried := watchRetries(ctx, r.b.retry)
	_, err := r.q.DeleteMessage(ctx, r.id, pop, nil)
	if err != nil && retried() && queueerror.HasCode(err, queueerror.MessageNotFound) {
		return nil
	}
	return err
}
