package record

import (
	"bytes"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Limit records exactly n data messages across concurrent connections, calls
// done once, and passes opens, ends, closes and losses through uncounted.
func TestLimitCountsMessages(t *testing.T) {
	var out bytes.Buffer
	ts := NewTextSink(&out, TextOptions{}) // serializes its writes itself
	var calls atomic.Int32
	s := Limit(ts, 5, func() { calls.Add(1) })
	now := time.Now()
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := s.Open(ConnInfo{Socket: "/x.sock", Start: now})
			for range 10 {
				r.Data(ClientToServer, now, []byte("ping"), "")
				r.Data(ServerToClient, now, nil, "") // no bytes, no note: not a message
			}
			Lost(r, ServerToClient, now, 3)
			r.End(ClientToServer, now)
			r.Close(i == 0, now)
		}()
	}
	wg.Wait()
	if n := calls.Load(); n != 1 {
		t.Fatalf("done called %d times, want 1", n)
	}
	text := out.String()
	if n := strings.Count(text, " 4 bytes\n"); n != 5 {
		t.Errorf("%d messages recorded, want 5:\n%s", n, text)
	}
	if n := strings.Count(text, " open: "); n != 4 {
		t.Errorf("%d opens recorded, want 4", n)
	}
	if n := strings.Count(text, "end of data"); n != 4 {
		t.Errorf("%d ends recorded, want 4", n)
	}
	if strings.Count(text, "closed") != 4 {
		t.Errorf("closes not passed through:\n%s", text)
	}
	if s.Err() != nil {
		t.Errorf("Err = %v", s.Err())
	}
	d, ok := s.(DropRecorder)
	if !ok {
		t.Fatal("a limited sink lost the DropRecorder of its sink")
	}
	d.Dropped(now, 7, "test")
	if !strings.Contains(out.String(), "LOST 7 events: test") {
		t.Errorf("Dropped not passed through:\n%s", out.String())
	}
}

// Losses are recorded while the limit is not reached.
func TestLimitPassesLosses(t *testing.T) {
	var out bytes.Buffer
	s := Limit(NewTextSink(&out, TextOptions{}), 2, nil)
	r := s.Open(ConnInfo{Socket: "/x.sock"})
	Lost(r, ClientToServer, time.Now(), 9)
	if !strings.Contains(out.String(), "9 bytes NOT CAPTURED") {
		t.Errorf("loss before the limit not recorded:\n%s", out.String())
	}
	if _, limited := Limit(&TextSink{}, 0, nil).(*limitSink); limited {
		t.Error("Limit 0 wrapped the sink: want no limit")
	}
}
