package doctor

import (
	"fmt"
	"net"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/udskit/udskit/capture"
	"github.com/udskit/udskit/socklist"
	"github.com/udskit/udskit/uds"
)

// service describes a well-known socket name.
type service struct {
	name  string // key in Options.SearchDirs
	title string
	match func(base string) bool
	glob  []string // file name patterns to look for
	// use says how to point the client at a socket found at p.
	use func(p string) string
	// probe names the sniff probe (probes) that proves the service on a TCP
	// port; tcpPorts lists the loopback ports to try for a socket named base.
	probe    string
	tcpPorts func(base string) []int
}

var pgName = regexp.MustCompile(`^\.s\.PGSQL\.([0-9]+)$`)

var services = []*service{
	{
		name: "postgresql", title: "PostgreSQL",
		match: pgName.MatchString,
		glob:  []string{".s.PGSQL.*"},
		use: func(p string) string {
			dir, port := filepath.Dir(p), pgName.FindStringSubmatch(filepath.Base(p))[1]
			return fmt.Sprintf("host=%s port=%s (psql -h %s -p %s; PGHOST=%s PGPORT=%s; unix_socket_directories says where the server puts it)",
				dir, port, dir, port, dir, port)
		},
		probe: "postgres",
		tcpPorts: func(base string) []int {
			n, _ := strconv.Atoi(pgName.FindStringSubmatch(base)[1])
			return uniquePorts(n, 5432, 5433)
		},
	},
	{
		name: "docker", title: "Docker",
		match: func(b string) bool { return b == "docker.sock" },
		glob:  []string{"docker.sock"},
		use: func(p string) string {
			return "DOCKER_HOST=unix://" + p + " (or docker context create --docker host=unix://" + p + ")"
		},
	},
	{
		name: "mysql", title: "MySQL/MariaDB",
		match: func(b string) bool { return b == "mysqld.sock" || b == "mysql.sock" || b == "mariadb.sock" },
		glob:  []string{"mysqld.sock", "mysql.sock", "mariadb.sock"},
		use:   func(p string) string { return "mysql --socket=" + p + " (socket= under [client] in my.cnf)" },
		// MySQL speaks first: no probe is sent, its greeting is enough.
		probe:    "mysql",
		tcpPorts: func(string) []int { return []int{3306} },
	},
	{
		name: "redis", title: "Redis",
		match: func(b string) bool { return strings.HasPrefix(b, "redis") && strings.HasSuffix(b, ".sock") },
		glob:  []string{"redis*.sock"},
		use: func(p string) string {
			return "redis-cli -s " + p + " (unixsocket in redis.conf says where the server puts it)"
		},
		probe:    "redis",
		tcpPorts: func(string) []int { return []int{6379} },
	},
}

// DefaultSearchDirs are the usual socket directories per service.
func DefaultSearchDirs(svc string) []string {
	home, _ := os.UserHomeDir()
	rt := os.Getenv("XDG_RUNTIME_DIR")
	if rt == "" {
		rt = fmt.Sprintf("/run/user/%d", os.Getuid())
	}
	switch svc {
	case "postgresql":
		return []string{"/tmp", "/var/run/postgresql", "/run/postgresql"}
	case "docker":
		d := []string{"/var/run", "/run", rt}
		if home != "" {
			d = append(d, filepath.Join(home, ".docker/run"), filepath.Join(home, ".colima/default"), filepath.Join(home, ".rd"))
		}
		return d
	case "mysql":
		return []string{"/var/run/mysqld", "/run/mysqld", "/tmp", "/var/lib/mysql"}
	case "redis":
		return []string{"/var/run/redis", "/run/redis", "/tmp"}
	}
	return nil
}

func serviceFor(a uds.Addr) *service {
	if a.Kind != uds.Unix {
		return nil
	}
	base := filepath.Base(a.Name)
	for _, s := range services {
		if s.match(base) {
			return s
		}
	}
	return nil
}

// Alternative is a live socket of the same service somewhere else.
type Alternative struct {
	Path  string          `json:"path"`
	Procs []socklist.Proc `json:"procs,omitempty"`
	// Use is how to point a client at it.
	Use string `json:"use"`
}

// liveAt reports whether a listener is bound to the socket file p.
func liveAt(snap *socklist.Snapshot, p string) (*socklist.Socket, bool) {
	if snap == nil {
		return nil, false
	}
	fi, err := os.Stat(p)
	if err != nil {
		return nil, false
	}
	var ls []socklist.Socket
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && snap.Source == "sock_diag" {
		ls = snap.ListenersOnFile(st.Ino, major(uint64(st.Dev)), minor(uint64(st.Dev)))
	} else {
		ls = snap.ListenersOnPath(p)
	}
	if len(ls) == 0 {
		return nil, false
	}
	return &ls[0], true
}

func serviceHints(r *Report, svc *service, a uds.Addr, abs string, snap *socklist.Snapshot, opts Options) {
	dirs, ok := opts.SearchDirs[svc.name]
	if !ok {
		dirs = DefaultSearchDirs(svc.name)
	}
	seen := map[string]bool{abs: true}
	addAlt := func(p string, l *socklist.Socket) {
		if seen[p] || !svc.match(filepath.Base(p)) {
			return
		}
		seen[p] = true
		r.Alternatives = append(r.Alternatives, Alternative{Path: p, Procs: l.Procs, Use: svc.use(p)})
	}
	for _, d := range dirs {
		for _, g := range svc.glob {
			ms, _ := filepath.Glob(filepath.Join(d, g))
			for _, m := range ms {
				if l, ok := liveAt(snap, m); ok {
					addAlt(m, l)
				}
			}
		}
	}
	// Listeners of this service anywhere else on the host, when the search
	// directories found none.
	if len(r.Alternatives) == 0 && snap != nil {
		for _, s := range snap.Sockets {
			if !s.Listening() || !strings.HasPrefix(s.Path, "/") {
				continue
			}
			for _, g := range svc.glob {
				if ok, _ := path.Match(g, filepath.Base(s.Path)); ok && len(r.Alternatives) < 5 {
					s := s
					addAlt(s.Path, &s)
				}
			}
		}
	}
	if r.Connected {
		r.add("service", Pass, "", "%s socket: clients use %s", svc.title, svc.use(abs))
		return
	}
	// A capture killed while interposed: the server listens under the aside name.
	if l, ok := liveAt(snap, abs+capture.AsideSuffix); ok {
		r.add("service", Warn, "udskit capture --restore "+abs+" puts it back at "+abs,
			"%s is live, set aside by a udskit capture at %s (%s)", svc.title, abs+capture.AsideSuffix, procsWords(l.Procs))
		return
	}
	// No socket of this name anywhere (other ports' sockets may exist): the
	// server may listen only on TCP, as in a container.
	sameName := false
	for _, a := range r.Alternatives {
		sameName = sameName || filepath.Base(a.Path) == filepath.Base(abs)
	}
	if !sameName {
		if tcp := findTCP(svc, filepath.Base(abs), opts); tcp != nil {
			r.TCP = tcp
			detail := fmt.Sprintf("no %s socket named %s on this kernel, but %s listens on TCP %s (%s)",
				svc.title, filepath.Base(abs), svc.title, tcp.Addr, tcp.Detail)
			for _, a := range r.Alternatives {
				detail += "; a socket for another port: " + a.Path
			}
			r.add("service", Warn, fmt.Sprintf("serve the socket the client wants from that port: udskit proxy --listen %s --mode 0666 --to tcp:%s "+
				"(0666: the client may run as another user, as %s's own socket is world-writable; or point the client at %s over TCP)",
				abs, tcp.Addr, svc.title, tcp.Addr), "%s", detail)
			return
		}
	}
	if len(r.Alternatives) == 0 {
		r.add("service", Warn, fmt.Sprintf("start %s, or find where it puts its socket (searched %s)", svc.title, strings.Join(dirs, ", ")),
			"%s socket name, but no live %s socket was found in the usual directories or anywhere on this kernel", svc.title, svc.title)
		return
	}
	alt := r.Alternatives[0]
	var others []string
	for _, o := range r.Alternatives[1:] {
		others = append(others, o.Path)
	}
	detail := fmt.Sprintf("a live %s socket is at %s (%s), not at %s", svc.title, alt.Path, procsWords(alt.Procs), abs)
	if len(others) > 0 {
		detail += "; also live: " + strings.Join(others, ", ")
	}
	r.add("service", Warn, "point the client there: "+alt.Use, "%s", detail)
}

// TCPService is the service found listening on a loopback TCP port.
type TCPService struct {
	Addr string `json:"addr"` // host:port
	// Detail is what the probe saw ("PostgreSQL answered the SSL request ...").
	Detail string `json:"detail"`
}

func uniquePorts(ps ...int) []int {
	var out []int
	for _, p := range ps {
		if p > 0 && p < 65536 && !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// findTCP looks for svc on its usual loopback TCP ports (Options.TCPPorts
// first), proving each with the service's harmless probe; nil when none answers.
func findTCP(svc *service, base string, opts Options) *TCPService {
	if svc.tcpPorts == nil {
		return nil
	}
	ports := uniquePorts(append(append([]int{}, opts.TCPPorts...), svc.tcpPorts(base)...)...)
	for _, host := range []string{"127.0.0.1", "::1"} {
		for _, port := range ports {
			addr := net.JoinHostPort(host, strconv.Itoa(port))
			if d, ok := probeTCP(addr, svc, opts.SniffTimeout); ok {
				return &TCPService{Addr: addr, Detail: d}
			}
		}
	}
	return nil
}

// probeTCP connects to addr and checks that the service answers there.
func probeTCP(addr string, svc *service, timeout time.Duration) (string, bool) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return "", false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout + 200*time.Millisecond))
	if p, ok := probes[svc.probe]; ok {
		if _, err := c.Write(p); err != nil {
			return "", false
		}
	}
	buf := make([]byte, MaxSniff)
	n, _ := c.Read(buf)
	proto, detail := Identify(svc.probe, buf[:n])
	if proto != svc.name {
		return "", false
	}
	return detail, true
}

// Container says whether this process runs in a container and how we know.
func Container(root string) (bool, string) {
	var ev []string
	for _, f := range []string{"/.dockerenv", "/run/.containerenv"} {
		if _, err := os.Stat(filepath.Join(root, f)); err == nil {
			ev = append(ev, f+" exists")
		}
	}
	if b, err := readCapped(filepath.Join(root, "proc/1/cgroup"), 64<<10); err == nil {
		for _, k := range []string{"docker", "kubepods", "containerd", "libpod", "lxc"} {
			if strings.Contains(string(b), k) {
				ev = append(ev, "/proc/1/cgroup mentions "+k)
				break
			}
		}
	}
	return len(ev) > 0, strings.Join(ev, ", ")
}

func readCapped(p string, n int64) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, n)
	m, err := f.Read(b)
	if m > 0 {
		return b[:m], nil
	}
	return nil, err
}

// kernelHints warns, inside a container, that the server of a socket that is
// missing or has no listener here may run on another kernel. Run calls it
// only then: a regular file or a permission problem is not the kernel's doing.
func kernelHints(r *Report, abs string, noFile bool, root string) {
	in, how := Container(root)
	if !in {
		return
	}
	_ = noFile
	r.add("kernel", Warn,
		"mount the server's socket directory here; across a VM, next to the server: udskit proxy --listen tcp:127.0.0.1:PORT --to "+abs+", and connect to host:PORT",
		"in a container (%s): unix sockets work on one kernel only", how)
}
