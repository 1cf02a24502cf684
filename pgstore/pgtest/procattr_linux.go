package pgtest

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// procAttr runs the postmaster as cred (nil: as the test), in a process
// group of its own, and kills it when the test process dies, even a
// panicking one (its children then exit by themselves).
func procAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred, Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// crash kills the postmaster pid and every child of it at once, as a crash
// of the machine would, and waits until the children are gone. A signal to
// the process group is not enough: each server process calls setsid, and
// one that outlives the postmaster keeps the shared memory the next start
// refuses to share. The postmaster is stopped first, so it forks no child
// while they are listed.
func crash(pid int, wait time.Duration) {
	_ = syscall.Kill(pid, syscall.SIGSTOP)
	kids := children(pid)
	for _, k := range kids {
		_ = syscall.Kill(k, syscall.SIGKILL)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	for deadline := time.Now().Add(wait); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		alive := false
		for _, k := range kids {
			alive = alive || running(k)
		}
		if !alive {
			return
		}
	}
}

// children lists the processes whose parent is pid.
func children(pid int) []int {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var kids []int
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := bytes.Fields(b[i+1:])
		if len(f) < 2 {
			continue
		}
		if ppid, _ := strconv.Atoi(string(f[1])); ppid == pid {
			if k, err := strconv.Atoi(filepath.Base(filepath.Dir(p))); err == nil {
				kids = append(kids, k)
			}
		}
	}
	return kids
}

// running reports whether pid is a process that has not exited (a zombie
// has: nobody may reap it here).
func running(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	f := bytes.Fields(b[i+1:])
	return len(f) > 0 && string(f[0]) != "Z" && string(f[0]) != "X"
}
