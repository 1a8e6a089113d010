//go:build !linux && !darwin

package uds

import "net"

// PeerCred is not implemented on this OS (unix systems other than Linux and
// macOS): it returns ErrNoCred, so a Policy
// refuses every peer rather than guessing.
func PeerCred(c net.Conn) (Cred, error) { return Cred{}, ErrNoCred }
