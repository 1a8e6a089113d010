package uds

import (
	"errors"
	"strings"
	"testing"
)

func TestParseAddrForms(t *testing.T) {
	for _, tc := range []struct {
		in, canon string
		want      Addr
	}{
		{"unix:/run/app.sock", "unix:/run/app.sock", Addr{Unix, "/run/app.sock"}},
		{"/tmp/x.sock", "unix:/tmp/x.sock", Addr{Unix, "/tmp/x.sock"}},
		{"./x.sock", "unix:./x.sock", Addr{Unix, "./x.sock"}},
		{"x.sock", "unix:x.sock", Addr{Unix, "x.sock"}},
		{"unix:x:y", "unix:x:y", Addr{Unix, "x:y"}},
		{"/a:b/c.sock", "unix:/a:b/c.sock", Addr{Unix, "/a:b/c.sock"}},
		{"unix:@name", "unix:@name", Addr{Abstract, "name"}},
		{"@name", "unix:@name", Addr{Abstract, "name"}},
		{"@with space", "unix:@with space", Addr{Abstract, "with space"}},
		{"tcp:127.0.0.1:7000", "tcp:127.0.0.1:7000", Addr{TCP, "127.0.0.1:7000"}},
		{"tcp:[::1]:7000", "tcp:[::1]:7000", Addr{TCP, "[::1]:7000"}},
		{"[::1]:7000", "tcp:[::1]:7000", Addr{TCP, "[::1]:7000"}},
		{"localhost:7000", "tcp:localhost:7000", Addr{TCP, "localhost:7000"}},
		{"tcp::0", "tcp::0", Addr{TCP, ":0"}},
		{":8080", "tcp::8080", Addr{TCP, ":8080"}},
	} {
		a, err := ParseAddr(tc.in)
		if err != nil || a != tc.want {
			t.Errorf("ParseAddr(%q) = %+v, %v; want %+v", tc.in, a, err, tc.want)
			continue
		}
		if a.String() != tc.canon {
			t.Errorf("%q: String() = %q, want %q", tc.in, a.String(), tc.canon)
		}
		if b, err := ParseAddr(a.String()); err != nil || b != a {
			t.Errorf("%q: round trip %q -> %+v, %v", tc.in, a.String(), b, err)
		}
		wantNet := "unix"
		if a.Kind == TCP {
			wantNet = "tcp"
		}
		if a.Network() != wantNet || a.IsUnix() == (a.Kind == TCP) {
			t.Errorf("%q: Network %q IsUnix %v", tc.in, a.Network(), a.IsUnix())
		}
	}
	if got := MustParseAddr("@x").SockaddrName(); got != "@x" {
		t.Errorf("abstract SockaddrName %q", got)
	}
	if got := MustParseAddr("unix:/p").SockaddrName(); got != "/p" {
		t.Errorf("path SockaddrName %q", got)
	}
}

func TestParseAddrErrors(t *testing.T) {
	for _, tc := range []struct{ in, reason string }{
		{"", "empty address"},
		{"unix:", "empty socket path"},
		{"unix:@", "empty abstract name"},
		{"@", "empty abstract name"},
		{"tcp:", "want host:port"},
		{"tcp:localhost", "want host:port"},
		{"tcp:::1:80", "want host:port"},
		{"tcp:host:http", "not a number"},
		{"tcp:host:70000", "not a number"},
		{"host:-1", "not a number"},
		{"tcp:a b:80", "not a host"},
		{"udp:1.2.3.4:5", `unknown scheme "udp"`},
		{"http://localhost:80/x", `unknown scheme "http"`},
		{"unixgram:/x.sock", `unknown scheme "unixgram"`},
		{"/a\x00b", "NUL"},
		{strings.Repeat("a", MaxAddrLen+1), "limit"},
	} {
		_, err := ParseAddr(tc.in)
		var ae *AddrError
		if !errors.As(err, &ae) {
			t.Errorf("ParseAddr(%q): want *AddrError, got %v", tc.in, err)
			continue
		}
		if !strings.Contains(ae.Reason, tc.reason) || !strings.Contains(err.Error(), AddrForms) {
			t.Errorf("ParseAddr(%q): %v; want reason with %q and the accepted forms", tc.in, err, tc.reason)
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("MustParseAddr did not panic on a bad address")
		}
	}()
	MustParseAddr("")
}

func FuzzParseAddr(f *testing.F) {
	for _, s := range []string{"unix:/run/a.sock", "/x", "./x", "x", "@n", "unix:@n", "tcp:[::1]:1",
		"h:1", "udp:a:1", "http://x", "unix:", "tcp::0", "[fe80::1%eth0]:80", "a:b:c",
		"tls:h:1", "tls:[::1]:8443", "ssh://u@h:22/p.sock", "ssh://[::1]/x", "ssh://a@b@h/x", "ssh://h/a:b", "fd:3", "systemd:x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, err := ParseAddr(s)
		if err != nil {
			if a != (Addr{}) {
				t.Fatalf("error with non-zero Addr %+v", a)
			}
			return
		}
		if a.Kind < Unix || a.Kind > SSH || a.Name == "" && a.Kind != TCP && a.Kind != TLS {
			t.Fatalf("ParseAddr(%q) = %+v", s, a)
		}
		if a.Kind == SSH && a.SSH().name() != a.Name {
			t.Fatalf("ParseAddr(%q) = %+v", s, a)
		}
		b, err := ParseAddr(a.String())
		if err != nil || b != a {
			t.Fatalf("round trip of %q: %q -> %+v, %v; want %+v", s, a.String(), b, err, a)
		}
		if a.String() != b.String() {
			t.Fatalf("String not canonical: %q vs %q", a.String(), b.String())
		}
	})
}

// "udp:x" parses as host "udp", port "x" (addresses.json: bad_port), and the
// reason says what was likely meant.
func TestForeignSchemeWithoutPortSaysSo(t *testing.T) {
	_, err := ParseAddr("udp:x")
	var ae *AddrError
	if !errors.As(err, &ae) || ae.Name != "bad_port" || !strings.Contains(ae.Reason, "udskit speaks unix:, tcp:, tls: and ssh://") {
		t.Fatalf("udp:x: %v", err)
	}
	if _, err := ParseAddr("db:x"); err == nil || strings.Contains(err.Error(), "scheme") {
		t.Fatalf("db:x: %v (a host name that is no scheme needs no scheme hint)", err)
	}
}
