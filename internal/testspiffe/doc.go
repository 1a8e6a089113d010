// Package testspiffe serves the SPIFFE Workload API (FetchX509SVID) over its
// real gRPC protocol on a unix socket, for tests of spiffetls and the CLI's
// --spiffe-socket: one workload's X.509-SVID issued by an internal/testpki CA.
package testspiffe
