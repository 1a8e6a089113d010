// Package doccheck keeps the Go examples in README.md and docs/*.md honest:
// its test (TestDocExamples, part of `make test`; alone: `make doccheck`)
// extracts every ```go block, compiles each complete one as its own program
// against this module, as a user who pasted it would (a temp module with
// `replace github.com/udskit/udskit => <this tree>`), and runs it where that
// means something. A failure names the Markdown file and line.
//
// The words after "go" on the fence line say what to do with a block:
//
//	```go                 a complete file (package clause): build it; if it
//	                      is package main, run it: exit 0 within 30 s
//	```go build           build only (it needs something the test cannot give)
//	```go listen=ADDR     run it while the test listens on ADDR (a client example)
//	```go serve=ADDR      run it until ADDR accepts a connection, then stop it
//	```go drain=ADDR      a server that drains: once ADDR accepts, the test holds
//	                      a connection open and sends SIGTERM; the program must
//	                      still be running 300 ms later (draining), and exit 0
//	                      within 10 s of the connection closing
//	```go fragment        a few lines, not a program: parsed (as statements or
//	                      declarations) so a syntax error still fails
//
// A block without a package clause must say "fragment": an example a reader
// cannot compile is said to be partial, not presented as whole.
package doccheck
