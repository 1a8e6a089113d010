package main

import (
	"os"
	"strings"
	"testing"
)

// docRecipe is one `udskit capture ...` command line of a doc.
type docRecipe struct {
	line string   // as written, less "sudo", pipes and comments
	args []string // the arguments after "udskit"
}

// captureRecipes returns the `udskit capture` command lines of a doc.
func captureRecipes(t *testing.T, file string) []docRecipe {
	t.Helper()
	doc, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []docRecipe
	for _, line := range strings.Split(string(doc), "\n") {
		line = strings.TrimPrefix(strings.TrimSpace(line), "sudo ")
		if !strings.HasPrefix(line, "udskit capture ") {
			continue
		}
		if i := strings.IndexAny(line, "|#"); i >= 0 {
			line = line[:i]
		}
		out = append(out, docRecipe{line: line, args: strings.Fields(line)[1:]})
	}
	return out
}
