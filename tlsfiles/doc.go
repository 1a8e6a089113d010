// Package tlsfiles makes the TLS configurations of udskit's tls: addresses
// from PEM files (a certificate chain, its private key, and a CA bundle) and
// reloads them when they change, so certificates rotate with no restart.
//
// A Source checks the files' identity (inode, size, modification time) at
// most once per CheckEvery, on a handshake; when any changed it loads all
// three, and keeps the previous set if the new one does not load (a
// certificate written before its key, say) until a later check finds a
// consistent set. Connections already open keep their session.
//
//	src, err := tlsfiles.Load(tlsfiles.Files{Cert: "svc.pem", Key: "svc-key.pem", CA: "ca.pem"}, tlsfiles.Options{})
//	l, err := uds.Listen(ctx, "tls:0.0.0.0:8443", uds.ListenOptions{TLS: src.ServerConfig(),
//		PeerPolicy: uds.AllowSPIFFE("spiffe://prod.example/ns/app/sa/web")})
//	c, err := uds.Dial(ctx, "tls:db-1:8443", uds.DialOptions{TLS: src.ClientConfig(tlsfiles.ClientOptions{})})
//
// Verification is never off: a client verifies the server's chain against
// the CA bundle (or the system roots when there is none) and its name, or,
// with ClientOptions.ServerSPIFFEID, its SPIFFE ID instead of a DNS name.
package tlsfiles
