package pcapng

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// FileRotation opens path for a rotated capture (tcpdump -C/-W) and returns
// the first output and the Options.Rotate function for the rest. Output n is
// named path.n (the first is path itself). With maxFiles > 0, only the
// newest maxFiles outputs are kept: starting output n removes output
// n-maxFiles. Files are created with mode 0600 and never through a symlink
// or over anything that is not a regular file.
func FileRotation(path string, maxFiles int) (io.WriteCloser, func(n int) (io.Writer, error), error) {
	name := func(n int) string {
		if n == 0 {
			return path
		}
		return fmt.Sprintf("%s.%d", path, n)
	}
	first, err := CreateFile(path)
	if err != nil {
		return nil, nil, err
	}
	rotate := func(n int) (io.Writer, error) {
		if maxFiles > 0 && n-maxFiles >= 0 {
			if err := os.Remove(name(n - maxFiles)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return nil, fmt.Errorf("remove old capture file: %w", err)
			}
		}
		return CreateFile(name(n))
	}
	return first, rotate, nil
}

// CreateFile creates (or truncates) a capture file with mode 0600, refusing
// a symlink or anything but a regular file at path.
func CreateFile(path string) (*os.File, error) {
	if fi, err := os.Lstat(path); err == nil && !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("capture file %s exists and is not a regular file (%s): refusing to write through it", path, fi.Mode().Type())
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|oNoFollow, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create capture file: %w", err)
	}
	return f, nil
}
