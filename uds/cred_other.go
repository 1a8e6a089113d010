//go:build !linux && !darwin

package uds

import "net"

// PeerCred is not implemented on this OS: it returns ErrNoCred, so a Policy
// refuses every peer rather than guessing.
func PeerCred(c net.Conn) (Cred, error) { return Cred{}, ErrNoCred }
