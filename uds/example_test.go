package uds_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/udskit/udskit/uds"
)

func ExampleParseAddr() {
	for _, s := range []string{"/run/app.sock", "@app", "localhost:7000", "udp:1.2.3.4:5"} {
		a, err := uds.ParseAddr(s)
		if err != nil {
			fmt.Println("error:", err.(*uds.AddrError).Reason)
			continue
		}
		fmt.Println(a.Kind, a)
	}
	// Output:
	// unix unix:/run/app.sock
	// abstract unix:@app
	// tcp tcp:localhost:7000
	// error: unknown scheme "udp"
}

func ExampleListen() {
	dir, _ := os.MkdirTemp("", "udskit-example-")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "run", "app.sock") // "run" is created 0700

	l, err := uds.Listen(context.Background(), path, uds.ListenOptions{})
	if err != nil {
		fmt.Println(err)
		return
	}
	fi, _ := os.Stat(path)
	fmt.Println("mode:", fi.Mode())

	// A second server on the same path is told who holds it.
	_, err = uds.Listen(context.Background(), path, uds.ListenOptions{})
	fmt.Println("in use:", errors.Is(err, uds.ErrInUse))

	l.Close() // removes the socket file: it is still ours
	_, err = os.Stat(path)
	fmt.Println("removed:", errors.Is(err, os.ErrNotExist))
	// Output:
	// mode: Srw-------
	// in use: true
	// removed: true
}

func ExampleDial() {
	dir, _ := os.MkdirTemp("", "udskit-example-")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "app.sock")

	_, err := uds.Dial(context.Background(), path, uds.DialOptions{})
	var de *uds.DialError
	if errors.As(err, &de) && errors.Is(err, syscall.ENOENT) {
		fmt.Println("not yet:", de.Cause == "no socket at "+path+": the server is not running or listens elsewhere")
	}

	// The server starts late; Wait retries with backoff until it answers.
	go func() {
		time.Sleep(100 * time.Millisecond)
		l, err := uds.Listen(context.Background(), path, uds.ListenOptions{})
		if err != nil {
			return
		}
		defer l.Close()
		c, err := l.Accept()
		if err == nil {
			c.Write([]byte("hello\n"))
			c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := uds.Dial(ctx, path, uds.DialOptions{Wait: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	line, _ := bufio.NewReader(c).ReadString('\n')
	fmt.Print("got: ", line)
	// Output:
	// not yet: true
	// got: hello
}

func ExamplePeerCred() {
	dir, _ := os.MkdirTemp("", "udskit-example-")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "app.sock")

	// Only this user may talk to the server; others are closed unread.
	l, err := uds.Listen(context.Background(), path, uds.ListenOptions{Policy: uds.AllowSameUser()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer l.Close()
	go func() {
		c, _ := uds.Dial(context.Background(), path, uds.DialOptions{})
		defer c.Close()
		time.Sleep(100 * time.Millisecond)
	}()
	c, err := l.Accept()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	cr, _ := uds.CredOf(c) // from the kernel, never from the peer
	fmt.Println("same pid:", cr.PID == int32(os.Getpid()), "same uid:", cr.UID == uint32(os.Getuid()))
	// Output: same pid: true same uid: true
}

func ExampleServer() {
	dir, _ := os.MkdirTemp("", "udskit-example-")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "echo.sock")

	s := &uds.Server{
		MaxConns: 100,
		Handler: func(ctx context.Context, c net.Conn) {
			r := bufio.NewReader(c)
			for {
				line, err := r.ReadString('\n')
				if err != nil {
					return
				}
				c.Write([]byte(line))
			}
		},
	}
	l, err := uds.Listen(context.Background(), path, uds.ListenOptions{})
	if err != nil {
		fmt.Println(err)
		return
	}
	go s.Serve(l)

	c, _ := uds.Dial(context.Background(), path, uds.DialOptions{})
	c.Write([]byte("ping\n"))
	line, _ := bufio.NewReader(c).ReadString('\n')
	fmt.Print(line)
	c.Close()

	// Graceful stop: no new conns, wait up to 5s for open ones, then force-close.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	fmt.Println("shutdown:", s.Shutdown(ctx), "active:", s.ActiveConns())
	// Output:
	// ping
	// shutdown: <nil> active: 0
}
