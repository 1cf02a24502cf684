//go:build !unix

package dirstore

import "errors"

func mkfifo(string) error { return errors.New("no FIFOs here") }
