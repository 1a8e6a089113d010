// Package testsvc starts real servers (PostgreSQL, Redis) for tests, on temp
// dirs and loopback ports, and stops them in t.Cleanup.
//
// Every helper skips the test (t.Skip with the reason) when the server binary
// is genuinely absent, and fails it when the binary is there but the server
// does not come up. Nothing listens outside a temp dir or 127.0.0.1.
//
//	pg := testsvc.StartPostgres(t, testsvc.PostgresOptions{})           // unix socket only
//	out := pg.Query(t, "select 1")                                      // psql over that socket
//	rd := testsvc.StartRedis(t, testsvc.RedisOptions{})                 // unix socket only
//	fmt.Println(pg.SocketPath(), rd.Socket)
//
// PostgreSQL refuses to run as root, so when the test runs as root the server
// runs as the "postgres" system user if there is one, else nobody/nogroup,
// via setpriv(1), in a temp dir chowned to that user.
package testsvc
