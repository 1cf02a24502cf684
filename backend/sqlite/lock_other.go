//go:build !unix

package sqlite

// fileLock is a no-op where flock is missing: processes then queue in
// SQLite's busy handler only.
type fileLock struct{}

func openFileLock(string) (*fileLock, error) { return &fileLock{}, nil }
func (l *fileLock) lock() error              { return nil }
func (l *fileLock) unlock()                  {}
func (l *fileLock) close()                   {}
func (l *fileLock) name() string             { return "" }
