package doctor

import (
	"bytes"
	"testing"
)

func TestWriteText(t *testing.T) {
	r := &Report{Checks: []Check{
		{ID: "exists", Status: Pass, Detail: "/tmp/x.sock exists", Fix: "never shown for a pass"},
		{ID: "connect", Status: Fail, Detail: "connection refused", Fix: "start the server"},
	}}
	var b bytes.Buffer
	r.WriteText(&b)
	want := "PASS  exists       /tmp/x.sock exists\n" +
		"FAIL  connect      connection refused\n" +
		"                   fix: start the server\n"
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
	r.Connected = true
	b.Reset()
	r.WriteText(&b)
	if !bytes.HasSuffix(b.Bytes(), []byte("OK: connected\n")) {
		t.Errorf("connected report lacks the OK line:\n%s", b.String())
	}
}
