package record

import (
	"os"
	"path/filepath"
	"testing"
)

// frameVector is the part of a protocol/vectors/frames.json entry the
// annotator tests read.
type frameVector struct {
	Name     string `json:"name"`
	Hex      string `json:"hex"`
	TypeName string `json:"type_name"`
	Method   string `json:"method"`
}

// repoFile finds a file of the repository from this package's directory,
// trying each candidate.
func repoFile(t *testing.T, candidates ...string) string {
	t.Helper()
	for _, c := range candidates {
		if p := filepath.Join("..", c); fileExists(p) {
			return p
		}
	}
	t.Fatalf("none of %v found", candidates)
	return ""
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }
