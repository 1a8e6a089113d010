package doccheck

import (
	"bufio"
	"errors"
	"fmt"
	"go/parser"
	"go/scanner"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// Block is one ```go block of a Markdown file.
type Block struct {
	File string // path relative to the module root
	Line int    // line of the first code line (after the fence)
	Code string
	// Mode is "run", "build", "listen", "serve", "drain" or "fragment";
	// Addr is the address of listen, serve and drain.
	Mode, Addr string
	// Package is the package clause's name ("" for a fragment).
	Package string
}

// Pos names a line of the block in its Markdown file (line 1 is Code's first).
func (b Block) Pos(line int) string { return fmt.Sprintf("%s:%d", b.File, b.Line+line-1) }

var pkgClause = regexp.MustCompile(`(?m)^package ([A-Za-z_][A-Za-z0-9_]*)`)

// Extract returns the ```go blocks of the Markdown file root/rel.
func Extract(root, rel string) ([]Block, error) {
	f, err := os.Open(filepath.Join(root, rel))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var (
		out  []Block
		cur  *Block
		code strings.Builder
		n    int
	)
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		n++
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case cur == nil && strings.HasPrefix(trimmed, "```go") && (len(trimmed) == 5 || trimmed[5] == ' '):
			b := Block{File: rel, Line: n + 1, Mode: "run"}
			for _, w := range strings.Fields(trimmed[5:]) {
				k, v, _ := strings.Cut(w, "=")
				switch k {
				case "build", "fragment":
					b.Mode = k
				case "listen", "serve", "drain":
					if v == "" {
						return nil, fmt.Errorf("%s:%d: %s needs an address (%s=ADDR)", rel, n, k, k)
					}
					b.Mode, b.Addr = k, v
				default:
					return nil, fmt.Errorf("%s:%d: unknown word %q after ```go (see internal/doccheck)", rel, n, w)
				}
			}
			cur = &b
			code.Reset()
		case cur != nil && strings.HasPrefix(trimmed, "```"):
			cur.Code = code.String()
			if m := pkgClause.FindStringSubmatch(cur.Code); m != nil {
				cur.Package = m[1]
			}
			if cur.Package == "" && cur.Mode != "fragment" {
				return nil, fmt.Errorf("%s:%d: a go block without a package clause: make it a complete program, or mark it ```go fragment", rel, cur.Line-1)
			}
			if cur.Package != "" && cur.Package != "main" && cur.Mode != "build" && cur.Mode != "fragment" {
				cur.Mode = "build" // a library package: nothing to run
			}
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			code.WriteString(line)
			code.WriteByte('\n')
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", rel, err)
	}
	if cur != nil {
		return nil, fmt.Errorf("%s:%d: ```go block never closed", rel, cur.Line-1)
	}
	return out, nil
}

// DocFiles lists README.md and docs/*.md under root, relative to it.
func DocFiles(root string) ([]string, error) {
	files := []string{"README.md"}
	m, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		return nil, err
	}
	sort.Strings(m)
	for _, p := range m {
		rel, _ := filepath.Rel(root, p)
		files = append(files, rel)
	}
	return files, nil
}

// ParseFragment checks a fragment's syntax: as statements in a function
// body, or else as top-level declarations. The error names the Markdown line.
func ParseFragment(b Block) error {
	fset := token.NewFileSet()
	if _, err := parser.ParseFile(fset, "", "package p; func _() {\n"+b.Code+"\n}", 0); err == nil {
		return nil
	}
	_, err := parser.ParseFile(fset, "", "package p\n"+b.Code, 0)
	if err == nil {
		return nil
	}
	var el scanner.ErrorList
	if errors.As(err, &el) && len(el) > 0 {
		return fmt.Errorf("%s: %s (the block parses neither as statements nor as declarations)", b.Pos(el[0].Pos.Line-1), el[0].Msg)
	}
	return fmt.Errorf("%s: %v", b.Pos(1), err)
}
