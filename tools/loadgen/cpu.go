package loadgen

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTick is the unit of the CPU times in /proc/<pid>/stat: USER_HZ, 100
// on every Linux architecture Go supports (the kernel ABI fixes it there,
// whatever the kernel's own HZ).
const clockTick = 10 * time.Millisecond

// CPU returns the CPU time (user + system) the processes pids have used
// since they started, summed, read from /proc (Linux only). A process that
// is gone is an error: its time would silently drop out of a delta.
func CPU(pids ...int) (time.Duration, error) {
	var total time.Duration
	for _, pid := range pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return 0, fmt.Errorf("cpu of pid %d: %w", pid, err)
		}
		d, err := parseStatCPU(string(b))
		if err != nil {
			return 0, fmt.Errorf("cpu of pid %d: %w", pid, err)
		}
		total += d
	}
	return total, nil
}

// ParsePIDs parses a comma-separated list of process IDs ("" is none).
func ParsePIDs(s string) ([]int, error) {
	var pids []int
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		pid, err := strconv.Atoi(f)
		if err != nil || pid < 1 {
			return nil, fmt.Errorf("process IDs %q: want positive integers, comma-separated", s)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

// parseStatCPU reads utime and stime (fields 14 and 15) of a
// /proc/<pid>/stat line. The command name (field 2) is in parentheses and
// may hold spaces and parentheses itself, so the fields are counted from
// the last ')'.
func parseStatCPU(stat string) (time.Duration, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("stat: no command name")
	}
	// After the name: state (field 3), ..., utime (14), stime (15).
	f := strings.Fields(stat[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("stat: %d fields after the command name, want at least 13", len(f))
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("stat: cpu time %q: %w", s, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * clockTick, nil
}
