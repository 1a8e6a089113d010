package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/udskit/udskit/bench"
	"github.com/udskit/udskit/rpc"
)

// The -shm-conns rows: a udskit shared-memory row (rpc-shm,
// rpc-shm-inplace, rpc-shm-inplace-view, and the same three with call
// slots: rpc-shm-calls, rpc-shm-calls-inplace, rpc-shm-calls-inplace-view) with the client's
// rpc.ClientOptions.ShmConns set, named "<row>/sc<N>" (rpc-shm/sc4). Each
// serves as its row does (the same server) and dials a client of its own, so
// rows at several N run interleaved in one run.

// shmConnsBases are the rows a -shm-conns row can be made from.
var shmConnsBases = []string{"rpc-shm", "rpc-shm-inplace", "rpc-shm-inplace-view",
	"rpc-shm-calls", "rpc-shm-calls-inplace", "rpc-shm-calls-inplace-view"}

// parseShmConnsRow splits "<row>/sc<N>"; ok is false for any other name.
func parseShmConnsRow(name string) (base string, n int, ok bool, err error) {
	base, num, found := strings.Cut(name, "/sc")
	if !found {
		return "", 0, false, nil
	}
	known := false
	for _, b := range shmConnsBases {
		known = known || b == base
	}
	n, err = strconv.Atoi(num)
	if !known || err != nil || n < 1 || n > 64 {
		return "", 0, false, fmt.Errorf("row %q: want <row>/sc<N> with <row> one of %s and N from 1 to 64", name, strings.Join(shmConnsBases, ", "))
	}
	return base, n, true, nil
}

// ensureShmConnsRow registers the row called name if it is a -shm-conns
// row not yet registered (in the client and in the server process).
func ensureShmConnsRow(name string) error {
	base, n, ok, err := parseShmConnsRow(name)
	if err != nil || !ok {
		return err
	}
	if _, done := bench.Lookup(name); done {
		return nil
	}
	t, found := bench.Lookup(base)
	if !found {
		return fmt.Errorf("row %q: %s is not registered", name, base)
	}
	view := strings.HasSuffix(base, "-view")
	calls := strings.HasPrefix(base, "rpc-shm-calls")
	bench.Register(&bench.Transport{
		Name: name, Network: t.Network, Family: t.Family,
		PerRequest: fmt.Sprintf("%s; the client with rpc.ClientOptions.ShmConns %d", t.PerRequest, n),
		Serve:      t.Serve,
		Dial: func(ctx context.Context, network, address string, conc int) (*bench.Client, error) {
			cl, _, err := dialShmConns(ctx, network+":"+address, conc, n, calls, view)
			return cl, err
		},
	})
	return nil
}

// expandShmConns adds, after each shared-memory row of rows, its
// -shm-conns rows for each N of list ("1,2,4").
func expandShmConns(rows []string, list string) ([]string, error) {
	if strings.TrimSpace(list) == "" {
		return rows, nil
	}
	var ns []int
	for _, f := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 64 {
			return nil, fmt.Errorf("-shm-conns: %q is not a number of connections from 1 to 64", f)
		}
		ns = append(ns, n)
	}
	var out []string
	for _, r := range rows {
		out = append(out, r)
		for _, b := range shmConnsBases {
			if strings.TrimSpace(r) != b {
				continue
			}
			for _, n := range ns {
				out = append(out, fmt.Sprintf("%s/sc%d", b, n))
			}
		}
	}
	return out, nil
}

// dialShmConns is the bench's rpc client with ShmConns n (and ShmCalls
// when calls); view makes CallRawView callers. It also returns the rpc
// client the callers share.
func dialShmConns(ctx context.Context, addr string, conc, n int, calls, view bool) (*bench.Client, *rpc.Client, error) {
	return bench.DialRPC(ctx, addr, conc, rpc.ClientOptions{ShmConns: n, ShmCalls: calls}, view)
}
