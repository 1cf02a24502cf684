//go:build !race

package testenv

// Race reports whether the binary was built with the race detector, which
// makes every process it starts several times slower.
const Race = false
