package proxy

import (
	"io"
	"os"
	"strconv"
	"strings"
)

// peerCommand reads /proc/PID/comm: the name of the process holding pid now.
// Pids are reused, so this is an observation about the peer, not a proof.
func peerCommand(pid int32) string {
	if pid <= 0 {
		return ""
	}
	f, err := os.Open("/proc/" + strconv.Itoa(int(pid)) + "/comm")
	if err != nil {
		return ""
	}
	defer f.Close()
	// comm is at most 16 bytes (TASK_COMM_LEN); read a little more, never more.
	b, _ := io.ReadAll(io.LimitReader(f, 64))
	return strings.TrimSpace(string(b))
}
