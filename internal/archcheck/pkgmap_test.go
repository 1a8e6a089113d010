package archcheck

import (
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// mapRow matches a row of the package map in docs/internals.md:
// | `pkg` | owns | may import |
var mapRow = regexp.MustCompile("^\\| `([^`]+)` \\| (.+) \\| (.+) \\|$")

// packageMap reads the "Package map" section of docs/internals.md: each
// package's allowed imports of this module (nil with anyPublic or anything
// for the two wildcards).
type allowed struct {
	imports   map[string]bool
	anyPublic bool // "any public package"
	anything  bool // "any package"
}

func packageMap(doc string) (map[string]allowed, error) {
	i := strings.Index(doc, "\n## Package map\n")
	if i < 0 {
		return nil, os.ErrNotExist
	}
	sec := doc[i+1:]
	if j := strings.Index(sec[3:], "\n## "); j >= 0 {
		sec = sec[:j+3]
	}
	out := map[string]allowed{}
	for _, line := range strings.Split(sec, "\n") {
		m := mapRow.FindStringSubmatch(strings.TrimSpace(line))
		if m == nil {
			continue
		}
		a := allowed{imports: map[string]bool{}}
		switch col := strings.TrimSpace(m[3]); col {
		case "—":
		case "any public package":
			a.anyPublic = true
		case "any package":
			a.anything = true
		default:
			for _, f := range strings.Split(col, ",") {
				a.imports[strings.Trim(strings.TrimSpace(f), "`")] = true
			}
		}
		out[m[1]] = a
	}
	return out, nil
}

// mapBreaches compares the module's packages with the map: one line per
// package missing from it, per row naming no package, and per import the
// row does not allow.
func mapBreaches(pkgs []pkg, pm map[string]allowed) []string {
	var out []string
	seen := map[string]bool{}
	for _, p := range pkgs {
		rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
		seen[rel] = true
		a, ok := pm[rel]
		if !ok {
			out = append(out, "docs/internals.md package map has no line for "+rel)
			continue
		}
		for _, imp := range p.Imports {
			if imp != module && !strings.HasPrefix(imp, module+"/") {
				continue
			}
			to := strings.TrimPrefix(imp, module+"/")
			if a.anything || a.anyPublic && isPublic(imp) || a.imports[to] {
				continue
			}
			out = append(out, rel+" imports "+to+", which its line in the docs/internals.md package map does not allow")
		}
	}
	for rel := range pm {
		if !seen[rel] {
			out = append(out, "docs/internals.md package map lists "+rel+", which is not a package of the module")
		}
	}
	sort.Strings(out)
	return out
}

// TestPackageMap keeps docs/internals.md's package map true: every package
// has a line, and imports only what its line allows.
func TestPackageMap(t *testing.T) {
	doc, err := os.ReadFile("../../docs/internals.md")
	if err != nil {
		t.Fatal(err)
	}
	pm, err := packageMap(string(doc))
	if err != nil || len(pm) < 10 {
		t.Fatalf("docs/internals.md: no package map section with rows (%d rows, %v)", len(pm), err)
	}
	for _, b := range mapBreaches(listModule(t), pm) {
		t.Error(b)
	}
}

// TestPackageMapCatches: a missing line, an import not allowed and a stale
// line are each reported.
func TestPackageMapCatches(t *testing.T) {
	doc := "# x\n\n## Package map\n\n| package | owns | may import (this module) |\n|---|---|---|\n" +
		"| `rpc` | calls | `frame` |\n| `gone` | nothing | — |\n| `cmd/udskit` | the CLI | any public package |\n\n## Next\n| `uds` | not in the map | — |\n"
	pm, err := packageMap(doc)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := pm["uds"]; ok {
		t.Fatal("a row after the section was read as part of the map")
	}
	got := mapBreaches([]pkg{
		{ImportPath: module + "/rpc", Imports: []string{module + "/frame", module + "/uds", "fmt"}},
		{ImportPath: module + "/cmd/udskit", Imports: []string{module + "/rpc", module + "/internal/proc"}},
		{ImportPath: module + "/uds"},
	}, pm)
	want := []string{
		"cmd/udskit imports internal/proc, which its line in the docs/internals.md package map does not allow",
		"docs/internals.md package map has no line for uds",
		"docs/internals.md package map lists gone, which is not a package of the module",
		"rpc imports uds, which its line in the docs/internals.md package map does not allow",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("breaches:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
