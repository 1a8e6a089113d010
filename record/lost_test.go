package record

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// noteRec is a Recording with no LostRecorder: what a custom sink may give.
type noteRec struct{ notes []string }

func (r *noteRec) Data(dir Dir, t time.Time, p []byte, note string) {
	if len(p) != 0 {
		panic("a loss recorded as data")
	}
	r.notes = append(r.notes, note)
}
func (r *noteRec) End(Dir, time.Time)       {}
func (r *noteRec) Close(bool, time.Time)    {}
func (s *noteSink) Open(ConnInfo) Recording { return &s.rec }
func (s *noteSink) Err() error              { return nil }

type noteSink struct{ rec noteRec }

// Lost goes to a LostRecorder when the Recording has one, else becomes a
// note on an empty Data; Dropped reaches only sinks that keep drop counts.
func TestLostAndDroppedFallbacks(t *testing.T) {
	now := time.Now()
	var ns noteSink
	Lost(ns.Open(ConnInfo{}), ServerToClient, now, 42)
	if len(ns.rec.notes) != 1 || ns.rec.notes[0] != "42 bytes not captured" {
		t.Errorf("fallback notes %q", ns.rec.notes)
	}
	Dropped(&ns, now, 3, "ignored") // not a DropRecorder: nothing, no panic

	var out bytes.Buffer
	ts := NewTextSink(&out, TextOptions{})
	Lost(ts.Open(ConnInfo{Socket: "/s"}), ClientToServer, now, 7)
	Dropped(ts, now, 5, "ring buffer full")
	for _, want := range []string{"7 bytes NOT CAPTURED", "LOST 5 events: ring buffer full"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("text view lacks %q:\n%s", want, out.String())
		}
	}
}
