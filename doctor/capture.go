package doctor

import (
	"fmt"
	"os"
	"syscall"

	"github.com/udskit/udskit/capture"
)

// checkCapture reports a udskit capture interposed on abs: the server's
// original socket set aside beside it, from a capture that is running or
// that was killed before it could put it back.
func checkCapture(r *Report, abs string) {
	if _, err := os.Lstat(abs + capture.AsideSuffix); err != nil {
		return
	}
	who := "no state file"
	if st, err := capture.ReadState(abs); err == nil {
		who = fmt.Sprintf("capture pid %d, started %s", st.PID, st.Started.Format("2006-01-02 15:04:05"))
		if st.PID > 0 && syscall.Kill(st.PID, 0) == syscall.ESRCH {
			r.add("capture", Fail, "put the server's socket back: udskit capture --restore "+abs,
				"a udskit capture interposed on this path was killed (%s; that process is gone): the server's own socket is set aside at %s and %s is the dead capture's relay",
				who, abs+capture.AsideSuffix, abs)
			return
		}
	}
	r.add("capture", Warn, "if that capture is not running any more (it was killed), put the original back: udskit capture --restore "+abs,
		"a udskit capture interposed on this path (%s): the server's own socket is set aside at %s and %s is the capture's relay", who, abs+capture.AsideSuffix, abs)
}
