package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testutil"
	"github.com/udskit/udskit/rpc"
	"github.com/udskit/udskit/uds"
)

// mdServer serves, in Go, "md" (unary) and "items" (a stream of one item),
// both answering with response metadata.
func mdServer(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(testutil.ShortDir(t, 0o700), "rmd.sock")
	l, err := uds.Listen(context.Background(), sock, uds.ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	srv := rpc.NewServer(rpc.ServerOptions{})
	rpc.HandleJSON(srv, "md", func(ctx context.Context, _ struct{}) (string, error) {
		return "ok", rpc.SetResponseMetadata(ctx, rpc.Metadata{"served-by": "go", "a": "1"})
	})
	srv.HandleRawStream("items", func(ctx context.Context, _ []byte, send func([]byte) error) error {
		if err := send([]byte(`1`)); err != nil {
			return err
		}
		return rpc.SetResponseMetadata(ctx, rpc.Metadata{"count": "1", "served-by": "go"})
	})
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return sock
}

// TestCallShowMetadata: `udskit call --show-metadata` prints the response
// metadata on stderr, sorted, for unary calls and streams; without the flag
// nothing extra is printed.
func TestCallShowMetadata(t *testing.T) {
	sock := mdServer(t)
	r := scRun(t, "", "call", sock, "md", "{}", "--show-metadata")
	if r.code != 0 || strings.TrimSpace(r.stdout) != `"ok"` || r.stderr != "< a: 1\n< served-by: go\n" {
		t.Fatalf("unary --show-metadata: %+v", r)
	}
	r = scRun(t, "", "call", sock, "items", "--show-metadata")
	if r.code != 0 || strings.TrimSpace(r.stdout) != `1` || r.stderr != "< count: 1\n< served-by: go\n" {
		t.Fatalf("stream --show-metadata: %+v", r)
	}
	if r := scRun(t, "", "call", sock, "md", "{}"); r.code != 0 || r.stderr != "" {
		t.Fatalf("without --show-metadata: %+v", r)
	}
}

// pyEnv runs python3 with clients/python/src on its path.
func pyCmd(ctx context.Context, script string, args ...string) *exec.Cmd {
	src, _ := filepath.Abs("../../clients/python/src")
	cmd := exec.CommandContext(ctx, "python3", append([]string{"-c", script}, args...)...)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+src)
	return cmd
}

// TestResponseMetadataGoServerPythonClient: a Python client sees a Go
// server's stream_end metadata as Stream.trailer (its existing API), async
// and sync.
func TestResponseMetadataGoServerPythonClient(t *testing.T) {
	sock := mdServer(t)
	script := `
import asyncio, json, sys, udskit
async def main():
    async with await udskit.connect(sys.argv[1], timeout=5) as c:
        s = c.stream("items", None)
        items = [x async for x in s]
        return items, s.trailer
items, trailer = asyncio.run(main())
with udskit.Client(sys.argv[1], timeout=5) as c:
    ss = c.stream("items", None)
    sitems = list(ss)
print(json.dumps({"items": items, "trailer": trailer, "sync": ss.trailer}, sort_keys=True))
`
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := pyCmd(ctx, script, sock).CombinedOutput()
	if err != nil {
		t.Fatalf("python client: %v\n%s", err, out)
	}
	want := `{"items": [1], "sync": {"count": "1", "served-by": "go"}, "trailer": {"count": "1", "served-by": "go"}}`
	if strings.TrimSpace(string(out)) != want {
		t.Fatalf("python client printed\n%s\nwant\n%s", out, want)
	}
}

// startScript starts a server script that prints one line when it listens
// and serves until its stdin closes.
func startScript(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr testutil.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- s
		io.Copy(io.Discard, stdout)
	}()
	select {
	case s := <-line:
		if !strings.Contains(s, "listening") {
			t.Fatalf("server script said %q; stderr:\n%s", s, stderr.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("server script did not start; stderr:\n%s", stderr.String())
	}
}

// TestResponseMetadataFromNodeAndPythonServers: the response metadata a
// Node handler (ctx.responseMetadata) and a Python handler
// (ctx.response_metadata) set reaches the Go client, unary and stream, with
// reserved keys hidden; `udskit call --show-metadata` prints it.
func TestResponseMetadataFromNodeAndPythonServers(t *testing.T) {
	dir := testutil.ShortDir(t, 0o700)
	dist := nodeDist(t)
	nodeSock, pySock := filepath.Join(dir, "n.sock"), filepath.Join(dir, "p.sock")
	nodeScript := `
import { createServer, stream } from ` + "'" + filepath.Join(dist, "index.js") + "'" + `;
const srv = createServer({ handlers: {
  md: (req, ctx) => { ctx.responseMetadata['served-by'] = 'node'; ctx.responseMetadata.a = '1'; return 'ok'; },
  items: stream(function* (req, ctx) { yield 1; ctx.responseMetadata.count = '1'; ctx.responseMetadata['served-by'] = 'node'; }),
} });
await srv.listen(process.argv[2]);
console.log('listening');
process.stdin.resume();
process.stdin.on('end', async () => { await srv.close(); process.exit(0); });
`
	nodeFile := filepath.Join(dir, "server.mjs")
	if err := os.WriteFile(nodeFile, []byte(nodeScript), 0o600); err != nil {
		t.Fatal(err)
	}
	startScript(t, exec.Command("node", nodeFile, nodeSock))
	pyScript := `
import asyncio, sys, udskit
async def md(ctx, req):
    ctx.response_metadata.update({"served-by": "py", "a": "1"})
    return "ok"
async def items(ctx, req):
    yield 1
    ctx.response_metadata.update({"count": "1", "served-by": "py"})
async def main():
    async with await udskit.serve(sys.argv[1], {"md": md, "items": items}):
        print("listening", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
asyncio.run(main())
`
	startScript(t, pyCmd(context.Background(), pyScript, pySock))

	for _, tc := range []struct{ who, sock string }{{"node", nodeSock}, {"py", pySock}} {
		c, err := rpc.Dial(context.Background(), tc.sock, rpc.ClientOptions{})
		if err != nil {
			t.Fatalf("%s: %v", tc.who, err)
		}
		var md rpc.Metadata
		ctx, cancel := context.WithTimeout(rpc.WithResponseMetadata(context.Background(), &md), 10*time.Second)
		var out string
		err = c.Call(ctx, "md", nil, &out)
		cancel()
		if err != nil || out != "ok" || len(md) != 2 || md["served-by"] != tc.who || md["a"] != "1" {
			t.Fatalf("%s unary: %q %v, metadata %v", tc.who, out, err, md)
		}
		var smd rpc.Metadata
		ctx, cancel = context.WithTimeout(rpc.WithResponseMetadata(context.Background(), &smd), 10*time.Second)
		st, err := c.Stream(ctx, "items", nil)
		if err != nil {
			t.Fatalf("%s stream: %v", tc.who, err)
		}
		var items []json.RawMessage
		for {
			b, err := st.RecvRaw()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("%s stream: %v", tc.who, err)
			}
			items = append(items, b)
		}
		cancel()
		if len(items) != 1 || len(smd) != 2 || smd["count"] != "1" || smd["served-by"] != tc.who {
			t.Fatalf("%s stream: %d items, metadata %v", tc.who, len(items), smd)
		}
		c.Close()
		r := scRun(t, "", "call", tc.sock, "md", "--show-metadata")
		if r.code != 0 || r.stderr != "< a: 1\n< served-by: "+tc.who+"\n" {
			t.Fatalf("%s: udskit call --show-metadata: %+v", tc.who, r)
		}
	}
}
