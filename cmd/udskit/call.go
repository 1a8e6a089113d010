package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/udskit/udskit/bench"
	"github.com/udskit/udskit/demo"
	"github.com/udskit/udskit/rpc"
	"github.com/udskit/udskit/uds"
)

// maxRawInput caps what --raw reads from stdin.
const maxRawInput = 16 << 20

func init() { register(newCallCmd) }

// callError prints an rpc error as "error: CODE (N): message" and exits 1.
func callError(err error) error {
	var e *rpc.Error
	var re *rpc.RefusedError
	if errors.As(err, &re) && re.Err.Code == rpc.PermissionDenied {
		return &exitError{code: 1, err: fmt.Errorf("error: %s (%d): %s\n(udskit serve/proxy: --allow-uid lists the users let in)",
			re.Err.Code, uint32(re.Err.Code), re.Err.Message)}
	}
	if errors.As(err, &e) {
		return &exitError{code: 1, err: fmt.Errorf("error: %s (%d): %s", e.Code, uint32(e.Code), e.Message)}
	}
	switch {
	case errors.Is(err, rpc.ErrClosedBeforeHello):
		// rpc's message lists the causes; name the serve flags behind them.
		err = fmt.Errorf("%w\n(for udskit serve: --allow-uid refuses other uids, --max-conns caps connections; "+
			"the server's log says which)", err)
	case errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		err = fmt.Errorf("%w\n(the server closed the connection: it may refuse your uid (serve --allow-uid), "+
			"be at its connection limit (--max-conns), or be shutting down; its log says which)", err)
	}
	return &exitError{code: 1, err: err}
}

func newCallCmd() *cobra.Command {
	var (
		timeout time.Duration
		wait    bool
		raw     bool
		stream  bool
		bidi    bool
		cstream bool
		n, c    int
		conns   int
		rf      remoteFlags
		list    bool
		headers []string
		showMD  bool
		noShm   bool
	)
	cmd := &cobra.Command{
		Use:   "call [ADDR] METHOD [JSON] | call [ADDR] --list",
		Short: "Call a method on a udskit rpc server and print the response (like grpcurl)",
		Long: `Calls METHOD on the udskit rpc server at ADDR with the JSON request (none: an empty request)
and prints the JSON response on stdout, or each item of a server-streaming method on its own
line. On failure it prints "error: CODE (N): message" on stderr and exits 1; bad usage exits 2.
--show-metadata prints the metadata the server sent with its answer (after the response, or
after a stream's last item) on stderr, one "< key: value" line each, sorted.

Without ADDR it calls the address udskit serve uses without one ($XDG_RUNTIME_DIR/udskit.sock,
else $TMPDIR/udskit-UID/udskit.sock). The first argument is ADDR when it looks like one
(it contains '/', ':' or '@', or ends in .sock) or when three arguments are given.

--raw sends stdin's bytes as the request and writes the response bytes to stdout unchanged.
A bidirectional method (udskit call ADDR --list shows its kind, bidi) or a client-streaming one
(client_stream) takes its request items from stdin, one JSON value per line (with --raw: each
line's bytes), sent as they are read; with a JSON argument that one value is the only item.
A bidi call prints each response item as it arrives; a client-streaming one prints its one
response after the last item. End of stdin ends the items (the server then ends the call).
--timeout bounds the whole call: raise it for a long session.

-n N -c C makes N calls from C concurrent callers and prints a latency summary instead of the
response. The callers share one client: calls multiplexed over at most --conns connections.

Addresses: ` + uds.AddrForms + "\n" + remoteHelp,
		Example: `  udskit call whoami                                              # the default address of udskit serve
  udskit call echo '{"hello":"world"}'
  udskit call /tmp/demo.sock echo '{"hello":"world"}'
  udskit call /tmp/demo.sock sleep '{"ms":200}' --timeout 100ms     # exits 1: deadline_exceeded
  udskit call /tmp/demo.sock stream '{"n":3,"interval_ms":100}'
  printf '1\n2\n4.5\n' | udskit call /tmp/demo.sock sum          # bidi: prints 1, 3, 7.5 as they come
  seq 100 | udskit call /tmp/demo.sock total                      # client-streaming: prints 5050
  udskit call --wait --timeout 5s /tmp/demo.sock whoami           # waits for the server to start
  head -c 1000 /dev/urandom | udskit call --raw /tmp/demo.sock echo | wc -c
  udskit call /tmp/demo.sock echo '"x"' -n 10000 -c 16
  head -c 1000000 /dev/zero | udskit call --raw /tmp/demo.sock echo -n 2000 -c 4 --no-shm   # the socket path, to compare
  udskit call tls:db-1:8443 whoami --tls-cert web.pem --tls-key web-key.pem --tls-ca ca.pem
  udskit call ssh://deploy@db-1/run/app/app.sock whoami          # through your ssh: the login user's uid
  udskit call /tmp/demo.sock --list                               # the server's methods
  udskit call /tmp/demo.sock echo '{}' -H tenant=acme -H trace=42 # with request metadata
  udskit call /tmp/app.sock getUser '{"id":1}' --show-metadata    # response metadata on stderr`,
		Args: func(cmd *cobra.Command, args []string) error {
			if list {
				if len(args) > 1 {
					return usage(fmt.Errorf("--list takes [ADDR] only, got %d arguments", len(args)))
				}
				return nil
			}
			if len(args) < 1 || len(args) > 3 || len(args) == 1 && looksLikeAddr(args[0]) {
				return usage(fmt.Errorf("want [ADDR] METHOD [JSON], got %d argument(s); see udskit call --help", len(args)))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			md, err := parseHeaders(headers)
			if err != nil {
				return usage(err)
			}
			if list {
				return listMethods(cmd, args, timeout, wait, &rf)
			}
			if len(args) == 3 || len(args) == 2 && looksLikeAddr(args[0]) {
				if _, err := parseAddr(args[0]); err != nil {
					return err
				}
			} else {
				def, err := demo.DefaultCallAddress()
				if err != nil {
					return err
				}
				args = append([]string{def}, args...)
				if len(args) == 3 && !json.Valid([]byte(args[2])) {
					return usage(fmt.Errorf("request %q is not valid JSON; if %q is a socket, write it as ./%s (see udskit call --help)", args[2], args[1], args[1]))
				}
			}
			addr, method := args[0], args[1]
			if timeout <= 0 {
				return usage(fmt.Errorf("--timeout %v: must be positive", timeout))
			}
			if n < 1 || c < 1 {
				return usage(fmt.Errorf("-n %d -c %d: both must be at least 1", n, c))
			}
			if conns < 1 {
				return usage(fmt.Errorf("--conns %d: must be at least 1", conns))
			}
			if bidi && cstream || (bidi || cstream) && (stream || n > 1 || c > 1) {
				return usage(errors.New("--bidi, --client-stream and --stream (or -n/-c) exclude each other"))
			}
			var req []byte
			switch {
			case raw && (bidi || cstream) && len(args) == 3:
				return usage(errors.New("--raw reads the items from stdin; drop the JSON argument"))
			case raw && (bidi || cstream): // items: stdin's lines, read as the call goes
			case raw && len(args) == 3:
				return usage(errors.New("--raw reads the request from stdin; drop the JSON argument"))
			case raw:
				b, err := io.ReadAll(io.LimitReader(cmd.InOrStdin(), maxRawInput+1))
				if err != nil {
					return fmt.Errorf("read stdin: %w", err)
				}
				if len(b) > maxRawInput {
					return usage(fmt.Errorf("--raw: stdin is over %d bytes", maxRawInput))
				}
				req = b
			case len(args) == 3:
				req = []byte(args[2])
				if !json.Valid(req) {
					return usage(fmt.Errorf("request %q is not valid JSON (strings need quotes: '\"text\"'); use --raw for bytes", args[2]))
				}
			}
			tlsConf, sshOpts, err := rf.dialAddr(cmd, addr)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			if md != nil {
				ctx = rpc.WithMetadata(ctx, md)
			}
			var respMD rpc.Metadata
			if showMD {
				ctx = rpc.WithResponseMetadata(ctx, &respMD)
			}
			cl, err := rpc.Dial(ctx, addr, rpc.ClientOptions{Wait: wait, NoReconnect: true, Conns: conns, TLS: tlsConf, SSH: sshOpts, NoShm: noShm})
			if err != nil {
				return callError(err)
			}
			defer cl.Close()
			out := cmd.OutOrStdout()
			if n > 1 || c > 1 {
				ctx, cancel := context.WithTimeout(cmd.Context(), timeout+time.Duration(n)*timeout/time.Duration(c))
				defer cancel()
				res := bench.Load(ctx, n, c, func(ctx context.Context) error {
					cctx, cancel := context.WithTimeout(ctx, timeout)
					defer cancel()
					_, err := cl.CallRaw(cctx, method, req, nil)
					return err
				})
				res.Write(out)
				if res.Errors > 0 {
					return callError(fmt.Errorf("%d of %d calls failed; first: %w", res.Errors, res.Requests, res.FirstErr))
				}
				return nil
			}
			if bidi || cstream {
				return callClientStream(ctx, cl, method, bidi, req, cmd.InOrStdin(), out, raw)
			}
			if !stream {
				resp, err := cl.CallRaw(ctx, method, req, nil)
				if err == nil {
					if err := printResp(out, resp, raw); err != nil {
						return err
					}
					return printMD(cmd.ErrOrStderr(), respMD)
				}
				if errors.Is(err, rpc.ErrBidiMethod) || errors.Is(err, rpc.ErrClientStreamMethod) {
					return callClientStream(ctx, cl, method, errors.Is(err, rpc.ErrBidiMethod), req, cmd.InOrStdin(), out, raw)
				}
				if !errors.Is(err, rpc.ErrStreamingMethod) {
					return callError(err)
				}
			}
			st, err := cl.Stream(ctx, method, req)
			if err != nil {
				return callError(err)
			}
			defer st.Close()
			for {
				item, err := st.RecvRaw()
				if errors.Is(err, io.EOF) {
					return printMD(cmd.ErrOrStderr(), respMD)
				}
				if err != nil {
					return callError(err)
				}
				if err := printResp(out, item, raw); err != nil {
					return err
				}
			}
		},
	}
	f := cmd.Flags()
	f.DurationVar(&timeout, "timeout", 10*time.Second, "deadline for connecting (and waiting) plus each call")
	f.BoolVar(&wait, "wait", false, "wait for the server's socket to appear and accept (within --timeout)")
	f.BoolVar(&raw, "raw", false, "send stdin's bytes as the request; write the response bytes unchanged")
	f.BoolVar(&stream, "stream", false, "call METHOD as server-streaming (found out automatically otherwise)")
	f.BoolVar(&bidi, "bidi", false, "call METHOD as bidirectional: items from stdin lines, responses as they come (found out automatically otherwise)")
	f.BoolVar(&cstream, "client-stream", false, "call METHOD as client-streaming: items from stdin lines, one response (found out automatically otherwise)")
	f.BoolVar(&list, "list", false, "list the server's methods (the standard method udskit.methods): name, kind, format")
	f.StringArrayVarP(&headers, "header", "H", nil, "request metadata key=value (repeatable)")
	f.BoolVar(&showMD, "show-metadata", false, "print the response metadata the server sent on stderr (\"< key: value\" lines)")
	f.IntVarP(&n, "requests", "n", 1, "number of calls (with -c: a quick load run with a latency summary)")
	f.IntVarP(&c, "concurrency", "c", 1, "concurrent callers for -n")
	f.IntVar(&conns, "conns", rpc.DefaultConns, "most connections the callers share (a second opens only when calls overlap)")
	f.BoolVar(&noShm, "no-shm", false, "offer the server no shared memory: every payload stays on the socket (by default, on Linux, a local unix socket to a Go server moves payloads of 16 KiB or more through a sealed memfd region; compare with -n/-c)")
	rf.addClient(f)
	return cmd
}

// looksLikeAddr says whether call's first argument is an address rather than
// a METHOD: it has a '/', ':' or '@', or ends in .sock.
func looksLikeAddr(s string) bool {
	return strings.ContainsAny(s, "/:@") || strings.HasSuffix(s, ".sock")
}

// printResp writes a response: raw bytes unchanged, or JSON on one line.
func printResp(w io.Writer, b []byte, raw bool) error {
	if raw {
		_, err := w.Write(b)
		return err
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return nil
	}
	_, err := fmt.Fprintf(w, "%s\n", bytes.TrimRight(b, "\n"))
	return err
}

// printMD writes response metadata as sorted "< key: value" lines.
func printMD(w io.Writer, md rpc.Metadata) error {
	keys := make([]string, 0, len(md))
	for k := range md {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if _, err := fmt.Fprintf(w, "< %s: %s\n", k, md[k]); err != nil {
			return err
		}
	}
	return nil
}

// parseHeaders turns -H key=value flags into request metadata.
func parseHeaders(hs []string) (rpc.Metadata, error) {
	if len(hs) == 0 {
		return nil, nil
	}
	md := rpc.Metadata{}
	for _, h := range hs {
		k, v, ok := strings.Cut(h, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("-H %q: want key=value", h)
		}
		if strings.HasPrefix(k, ":") {
			return nil, fmt.Errorf("-H %q: keys starting with ':' are reserved for the protocol", h)
		}
		md[k] = v
	}
	return md, nil
}

// listMethods prints the server's methods (udskit.methods), one a line:
// name, kind, format.
func listMethods(cmd *cobra.Command, args []string, timeout time.Duration, wait bool, rf *remoteFlags) error {
	addr, err := addrArg(args)
	if err != nil {
		return err
	}
	tlsConf, sshOpts, err := rf.dialAddr(cmd, addr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
	defer cancel()
	cl, err := rpc.Dial(ctx, addr, rpc.ClientOptions{Wait: wait, NoReconnect: true, TLS: tlsConf, SSH: sshOpts})
	if err != nil {
		return callError(err)
	}
	defer cl.Close()
	ms, err := rpc.ListMethods(ctx, cl)
	if err != nil {
		if rpc.CodeOf(err) == rpc.Unimplemented {
			err = fmt.Errorf("%w\n(the server predates udskit.methods: it cannot list its methods)", err)
		}
		return callError(err)
	}
	w := cmd.OutOrStdout()
	for _, m := range ms {
		fmt.Fprintf(w, "%-24s %-13s %s\n", m.Name, m.Kind, m.Format)
	}
	return nil
}

// addrArg is the one optional ADDR argument of call --list and health, or
// the address serve uses without one.
func addrArg(args []string) (string, error) {
	if len(args) == 1 {
		return args[0], nil
	}
	return demo.DefaultCallAddress()
}
