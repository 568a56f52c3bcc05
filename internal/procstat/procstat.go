// Package procstat reads what the benchmarks need of /proc/PID/stat on
// Linux: a process's parent and the CPU it and its waited-for children
// used.
package procstat

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// ticks is USER_HZ on Linux, the unit of the CPU fields.
const ticks = 100

// Stat is what is read of one process.
type Stat struct {
	PPID int
	// Self is the user and system CPU the process used so far; Children
	// that of its children already exited and waited for.
	Self, Children time.Duration
}

// Read reads /proc/pid/stat.
func Read(pid int) (Stat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return Stat{}, err
	}
	// The fields after the command name, which may hold spaces, in
	// parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return Stat{}, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 15 {
		return Stat{}, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	n := func(k int) int64 { v, _ := strconv.ParseInt(f[k], 10, 64); return v }
	ppid, _ := strconv.Atoi(f[1])
	return Stat{
		PPID:     ppid,
		Self:     time.Duration(n(11)+n(12)) * time.Second / ticks,
		Children: time.Duration(n(13)+n(14)) * time.Second / ticks,
	}, nil
}

// CPU is the CPU process pid used so far, 0 if it cannot be read (a
// process gone).
func CPU(pid int) time.Duration {
	st, err := Read(pid)
	if err != nil {
		return 0
	}
	return st.Self
}
