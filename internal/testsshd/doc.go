// Package testsshd runs a real OpenSSH server (Debian's openssh-server,
// installed by scripts/install-deps.sh) on 127.0.0.1 for tests of ssh://
// addresses: a throwaway host key, a user key, authorized_keys and a
// known_hosts file in a temp dir, and ssh arguments that use only those (not
// the user's ~/.ssh).
package testsshd
