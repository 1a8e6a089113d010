// Package archcheck holds no code, only a test that keeps the module's
// layering true as packages move (go list over the whole module):
//
//   - no package under internal/ imports a public package of this module
//     (internal/ holds libraries the public packages build on, never the
//     other way round; a package's own _test.go files may import anything);
//   - internal/ holds no commands, and cmd/ holds only the product
//     (cmd/udskit): soak, bench and echo harnesses live under tools/;
//   - kcapture does not import capture, directly or through another package.
//
// Run alone: go test ./internal/archcheck
package archcheck
