package workflow

import "context"

type resultsKey struct{}

// WithResults returns ctx carrying the results of the dependencies of the
// step being handled, by step name (nil for a dependency that set none,
// was skipped, or failed under the Run policy). The platform sets it
// around a step's handler; jobtest sets it to run a step alone.
func WithResults(ctx context.Context, results map[string][]byte) context.Context {
	return context.WithValue(ctx, resultsKey{}, results)
}

// ResultsFrom returns the dependency results WithResults put in ctx, and
// whether there were any: false outside a step's handler.
func ResultsFrom(ctx context.Context) (map[string][]byte, bool) {
	m, ok := ctx.Value(resultsKey{}).(map[string][]byte)
	return m, ok
}
