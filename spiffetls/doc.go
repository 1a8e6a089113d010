// Package spiffetls makes the TLS configurations of udskit's tls: addresses
// from the SPIFFE Workload API (SPIRE's agent, Istio's), through go-spiffe v2:
// the workload's X.509-SVID as its certificate, its trust domain's bundle as
// the CA pool, both updated as the Workload API rotates them, no files.
//
// It is an opt-in subpackage: nothing in udskit's core imports it, so
// programs that do not use SPIFFE do not link go-spiffe.
//
//	src, err := spiffetls.NewSource(ctx, "") // $SPIFFE_ENDPOINT_SOCKET
//	conf, err := spiffetls.ServerConfig(src)
//	l, err := uds.Listen(ctx, "tls:0.0.0.0:8443", uds.ListenOptions{TLS: conf,
//		PeerPolicy: uds.AllowSPIFFE("spiffe://prod.example/ns/app/sa/web")})
//
// The configurations use the standard library's chain verification (the CA
// pool is the bundle), so uds's PeerPolicy sees the client's verified
// identity exactly as with tlsfiles. ServerConfig's federatesWith admits
// workloads of other trust domains (SPIFFE federation), each verified
// against its own trust domain's bundle; ClientConfig verifies a server
// against the bundle of its ID's trust domain.
package spiffetls
