package doctor

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/udskit/udskit/uds"
)

// proxyRoutes reads the command line of pid and, when it is `udskit proxy`,
// returns its --listen/--to pairs in order (relative paths resolved against
// the proxy's working directory). It reads /proc (Linux); elsewhere, or for
// any other program, it returns nil.
func proxyRoutes(pid int) [][2]string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || len(b) > 64<<10 {
		return nil
	}
	args := strings.Split(string(bytes.TrimRight(b, "\x00")), "\x00")
	// udskit, or a build of it under another name starting so (udskit.test).
	if len(args) < 2 || !strings.HasPrefix(filepath.Base(args[0]), "udskit") || args[1] != "proxy" {
		return nil
	}
	cwd, _ := os.Readlink("/proc/" + strconv.Itoa(pid) + "/cwd")
	var routes [][2]string
	var listen string
	for i := 2; i < len(args); i++ {
		flag, val, hasVal := strings.Cut(args[i], "=")
		if flag != "--listen" && flag != "--to" {
			continue
		}
		if !hasVal {
			if i+1 >= len(args) {
				break
			}
			i++
			val = args[i]
		}
		if flag == "--listen" {
			listen = val
			continue
		}
		if listen != "" {
			routes = append(routes, [2]string{canonical(listen, cwd), canonical(val, cwd)})
			listen = ""
		}
	}
	return routes
}

// canonical is addr in udskit's canonical form, a relative unix path made
// absolute against dir.
func canonical(addr, dir string) string {
	a, err := uds.ParseAddr(addr)
	if err != nil {
		return addr
	}
	if a.Kind == uds.Unix && !filepath.IsAbs(a.Name) && dir != "" {
		a.Name = filepath.Join(dir, a.Name)
	}
	return a.String()
}

// checkProxyUpstream: when the server that answered is a udskit proxy, the
// connection succeeding says nothing about the server behind it. Find the
// route from the proxy's command line and try its upstream.
func checkProxyUpstream(ctx context.Context, r *Report, a uds.Addr, pid int, timeout time.Duration) {
	routes := proxyRoutes(pid)
	if routes == nil {
		return
	}
	me := a.String()
	if a.Kind == uds.Unix {
		if abs, err := filepath.Abs(a.Name); err == nil {
			me = canonical(abs, "")
		}
	}
	for _, rt := range routes {
		if rt[0] != me {
			continue
		}
		up := rt[1]
		ctx, cancel := context.WithTimeout(ctx, timeout)
		c, err := uds.Dial(ctx, up, uds.DialOptions{})
		cancel()
		if err != nil {
			r.add("upstream", Fail, fmt.Sprintf("start the server the proxy relays to (%s), or point the proxy at where it listens", up),
				"the server here is udskit proxy (pid %d), relaying to %s, which does not answer: %v; every connection here is closed at once", pid, up, err)
			r.Connected = false
			return
		}
		c.Close()
		r.add("upstream", Pass, "", "the server here is udskit proxy (pid %d), relaying to %s, which accepts connections", pid, up)
		return
	}
}
