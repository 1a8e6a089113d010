// Package testpki makes throwaway certificate authorities and certificates
// for tests of udskit's tls: addresses: a CA, and leaves with DNS names, IP
// addresses, SPIFFE IDs and chosen validity, written as PEM files.
package testpki
