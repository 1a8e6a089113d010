package capture

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/udskit/udskit/frame"
	"github.com/udskit/udskit/pcapng"
)

// repoFile finds a file of the repository from this package's directory,
// trying each candidate (the protocol files may move to protocol/).
func repoFile(t *testing.T, candidates ...string) string {
	t.Helper()
	for _, c := range candidates {
		p := filepath.Join("..", c)
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Fatalf("none of %v found", candidates)
	return ""
}

func needTshark(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("tshark")
	if err != nil {
		t.Fatalf("tshark is not installed (run scripts/install-deps.sh): %v", err)
	}
	return p
}

// tsharkLua runs tshark with the udskit dissector loaded.
func tsharkLua(t *testing.T, file string, args ...string) string {
	t.Helper()
	lua, _ := filepath.Abs(repoFile(t, "wireshark/udskit.lua", "protocol/wireshark/udskit.lua"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, needTshark(t), append([]string{"-X", "lua_script:" + lua, "-r", file}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("tshark: %v\n%s", err, errb.String())
	}
	if strings.Contains(errb.String(), "Lua: Error") || strings.Contains(errb.String(), "lua_script") {
		t.Fatalf("the dissector failed to load:\n%s", errb.String())
	}
	return out.String()
}

type frameVector struct {
	Name     string     `json:"name"`
	Hex      string     `json:"hex"`
	Type     int        `json:"type"`
	TypeName string     `json:"type_name"`
	ID       uint32     `json:"id"`
	Method   string     `json:"method"`
	Metadata [][]string `json:"metadata"`
	Code     int        `json:"code"`
	CodeName string     `json:"code_name"`
	Message  string     `json:"message"`
}

// TestLuaDissectorVectors: every valid frame, hello and NDJSON line of the
// protocol vectors, put in a capture, is decoded by wireshark/udskit.lua to
// the fields the vectors list.
func TestLuaDissectorVectors(t *testing.T) {
	var frames struct {
		Valid []frameVector `json:"valid"`
	}
	var hellos struct {
		Valid []struct {
			Hex      string `json:"hex"`
			Version  int    `json:"version"`
			MaxFrame uint32 `json:"max_frame"`
		} `json:"valid"`
	}
	var nd struct {
		Requests []struct {
			Line string `json:"line"`
			ID   string `json:"id"`
			Func string `json:"func"`
		} `json:"requests"`
	}
	for name, v := range map[string]any{"frames.json": &frames, "hello.json": &hellos, "ndjson.json": &nd} {
		b, err := os.ReadFile(repoFile(t, "protocol/vectors/"+name, "testdata/vectors/"+name))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatal(err)
		}
	}
	file := filepath.Join(t.TempDir(), "vectors.pcapng")
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	w, _ := pcapng.NewWriter(f, pcapng.Options{})
	ifc, _ := w.AddInterface("/vectors.sock", "")
	now := time.Now()
	clientHello, _ := hex.DecodeString(hellos.Valid[0].Hex)
	serverHello, _ := hex.DecodeString(hellos.Valid[1].Hex)
	// Stream i carries hello, hello, then frame vector i (a client frame from
	// the client, every other from the server).
	for _, v := range frames.Valid {
		fl, err := w.OpenFlow(pcapng.FlowInfo{Interface: ifc, ServerPort: UdskitPort}, now)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := hex.DecodeString(v.Hex)
		fl.Data(ClientToServer, now, clientHello)
		fl.Data(ServerToClient, now, serverHello)
		dir := ServerToClient
		if v.Type == 1 || v.Type == 4 || v.Type == 10 || v.Type == 11 || v.Type == 12 {
			dir = ClientToServer
		}
		// Split the frame in two segments: the dissector must reassemble.
		fl.Data(dir, now, raw[:len(raw)/2])
		fl.Data(dir, now, raw[len(raw)/2:])
		fl.Close(false, now)
	}
	ndStream := len(frames.Valid)
	fl, _ := w.OpenFlow(pcapng.FlowInfo{Interface: ifc, ServerPort: UdskitPort}, now)
	for _, r := range nd.Requests {
		fl.Data(ClientToServer, now, []byte(r.Line+"\n"))
	}
	fl.Close(false, now)
	// A udskit connection on another port: the heuristic (hello magic) finds it.
	heurStream := ndStream + 1
	fl, _ = w.OpenFlow(pcapng.FlowInfo{Interface: ifc, ServerPort: 9999}, now)
	req, _ := hex.DecodeString(frames.Valid[1].Hex)
	fl.Data(ClientToServer, now, append(append([]byte(nil), clientHello...), req...))
	fl.Close(false, now)
	w.Close()
	f.Close()

	out := tsharkLua(t, file, "-Y", "udskit.type", "-T", "fields", "-E", "separator=|",
		"-e", "tcp.stream", "-e", "udskit.type", "-e", "udskit.id", "-e", "udskit.method",
		"-e", "udskit.md.key", "-e", "udskit.md.value", "-e", "udskit.code", "-e", "udskit.code_name", "-e", "udskit.message")
	got := map[int][]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		fs := strings.Split(line, "|")
		n, _ := strconv.Atoi(fs[0])
		got[n] = fs[1:]
	}
	for i, v := range frames.Valid {
		g, ok := got[i]
		if !ok {
			t.Errorf("%s: not decoded", v.Name)
			continue
		}
		var keys, vals []string
		for _, kv := range v.Metadata {
			if kv[0] == frame.PadKey { // shown as its size, not as zeros
				kv[1] = fmt.Sprintf("%d bytes of padding", len(kv[1]))
			}
			keys, vals = append(keys, kv[0]), append(vals, kv[1])
		}
		want := []string{strconv.Itoa(v.Type), strconv.FormatUint(uint64(v.ID), 10), v.Method,
			strings.Join(keys, ","), strings.Join(vals, ","), "", "", v.Message}
		if v.Type == 3 {
			want[5], want[6] = strconv.Itoa(v.Code), v.CodeName
		}
		if strings.Join(g, "|") != strings.Join(want, "|") {
			t.Errorf("%s:\n got  %q\n want %q", v.Name, g, want)
		}
	}
	out = tsharkLua(t, file, "-Y", "udskit.hello.version", "-T", "fields", "-e", "udskit.hello.version", "-e", "udskit.hello.max_frame")
	if !strings.Contains(out, "1\t16777216") {
		t.Errorf("hello not decoded: %q", out)
	}
	out = tsharkLua(t, file, "-Y", "tcp.stream=="+strconv.Itoa(ndStream)+" && udskit.ndjson.func", "-T", "fields", "-e", "udskit.ndjson.id", "-e", "udskit.ndjson.func")
	for _, r := range nd.Requests {
		if !strings.Contains(out, r.ID+"\t"+r.Func) && !strings.Contains(out, r.ID+","+r.ID) {
			t.Errorf("NDJSON %q: id %s func %s not in\n%s", r.Line, r.ID, r.Func, out)
		}
	}
	out = tsharkLua(t, file, "-Y", "tcp.stream=="+strconv.Itoa(heurStream)+" && udskit.method", "-T", "fields", "-e", "udskit.method")
	if strings.TrimSpace(out) != frames.Valid[1].Method {
		t.Errorf("udskit on port 9999 (heuristic): %q", out)
	}
	// Nothing flagged malformed.
	if out := tsharkLua(t, file, "-Y", "udskit.malformed || _ws.malformed"); strings.TrimSpace(out) != "" {
		t.Errorf("malformed:\n%s", out)
	}
}
