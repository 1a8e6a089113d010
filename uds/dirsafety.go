package uds

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// DirRisk is a way another user could get between clients and the server of
// a socket path: by moving the socket aside and putting their own in its
// place, or by pointing the path somewhere else.
type DirRisk struct {
	// Dir is the directory or symlink at fault.
	Dir string `json:"dir"`
	// Problem says what is wrong, in plain words.
	Problem string `json:"problem"`
	// Fix says what to do.
	Fix string `json:"fix"`
}

func (r DirRisk) String() string { return r.Problem + "; fix: " + r.Fix }

// CheckDirs looks at every directory above the socket path (the parent and
// each one above it, along the path as given and along the path it resolves
// to) and returns the risks it finds:
//
//   - a directory writable by others without the sticky bit (anyone may
//     rename or delete the socket and bind their own there);
//   - a symlink on the way owned by a user other than root and us (that user
//     can point the path at a directory of their own).
//
// Directories writable by others with the sticky bit (/tmp) are fine: only
// the socket's owner may remove or rename it there. CheckDirs reads only
// metadata; a directory it cannot look at is skipped. It returns nil for
// abstract names and TCP (no file) and for an empty or unparsable address.
func CheckDirs(address string) []DirRisk {
	a, err := ParseAddr(address)
	if err != nil || a.Kind != Unix {
		return nil
	}
	abs, err := filepath.Abs(a.Name)
	if err != nil {
		return nil
	}
	dir := filepath.Dir(abs)
	var risks []DirRisk
	// Along the path as given: symlinks only (what they point to is looked
	// at on the resolved path, so that nothing is reported twice).
	for _, d := range ancestors(dir) {
		if r, ok := symlinkRisk(d); ok {
			risks = append(risks, r)
		}
	}
	// Along the resolved path (or the path as given, up to where it exists).
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		real = dir
	}
	for _, d := range ancestors(real) {
		if r, ok := dirRisk(d); ok {
			risks = append(risks, r)
		}
	}
	return risks
}

// ancestors returns "/" then each directory down to dir.
func ancestors(dir string) []string {
	var out []string
	for d := dir; ; d = filepath.Dir(d) {
		out = append(out, d)
		if d == "/" || d == "." {
			break
		}
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

func symlinkRisk(d string) (DirRisk, bool) {
	fi, err := os.Lstat(d)
	if err != nil || fi.Mode().Type() != fs.ModeSymlink {
		return DirRisk{}, false
	}
	if uid, ok := fileOwner(fi); ok && uid != 0 && uid != os.Geteuid() {
		return DirRisk{Dir: d,
			Problem: fmt.Sprintf("%s is a symlink owned by uid %d, who can point it elsewhere and serve in our place", d, uid),
			Fix:     "use the path it points to, or a directory only root and this user control (e.g. $XDG_RUNTIME_DIR or /run/APP)"}, true
	}
	return DirRisk{}, false
}

func dirRisk(d string) (DirRisk, bool) {
	fi, err := os.Lstat(d)
	if err != nil || !fi.IsDir() {
		return DirRisk{}, false
	}
	if m := fi.Mode(); m.Perm()&0o002 != 0 && m&fs.ModeSticky == 0 {
		return DirRisk{Dir: d,
			Problem: fmt.Sprintf("directory %s (%s) is writable by every user and has no sticky bit: anyone can move the socket aside and put their own in its place", d, m),
			Fix:     fmt.Sprintf("chmod o-w %s (or chmod +t %s), or put the socket in a directory only this user controls", d, d)}, true
	}
	return DirRisk{}, false
}
