package doctor

import (
	"fmt"
	"io"
)

// WriteText prints the report as `udskit doctor` shows it: one line per
// check (status, id, detail), the fix under each check that did not pass, and
// "OK: connected" at the end when a connection succeeded.
func (r *Report) WriteText(w io.Writer) {
	for _, c := range r.Checks {
		fmt.Fprintf(w, "%-4s  %-11s  %s\n", c.Status, c.ID, c.Detail)
		if c.Fix != "" && c.Status != Pass {
			fmt.Fprintf(w, "      %-11s  fix: %s\n", "", c.Fix)
		}
	}
	if r.Connected {
		fmt.Fprintln(w, "OK: connected")
	}
}
