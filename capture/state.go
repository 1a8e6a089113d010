package capture

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"
)

// State is what a running capture writes beside the socket (PATH +
// StateSuffix) so that a later Restore can put the original back.
type State struct {
	PID       int       `json:"pid"`
	Path      string    `json:"path"`
	Started   time.Time `json:"started"`
	OrigDev   uint64    `json:"orig_dev"`
	OrigIno   uint64    `json:"orig_ino"`
	RelayIno  uint64    `json:"relay_ino,omitempty"`
	Interpose bool      `json:"interposed"`
}

// maxState caps the state file a Restore reads.
const maxState = 64 << 10

// ReadState reads the state file of path, if there is one.
func ReadState(path string) (*State, error) {
	f, err := os.OpenFile(path+StateSuffix, os.O_RDONLY|oNoFollow, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxState+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxState {
		return nil, fmt.Errorf("state file %s is over %d bytes", path+StateSuffix, maxState)
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("state file %s: %w", path+StateSuffix, err)
	}
	return &st, nil
}

// createState creates the state file, failing if one exists: it is also
// the lock that keeps two captures of one path from starting together.
func createState(path string, st *State) error {
	return writeNewState(path+StateSuffix, st)
}

// writeState replaces the state file atomically (temp file and rename),
// mode 0600, never through a symlink.
func writeState(path string, st *State) error {
	tmp := path + StateSuffix + ".tmp"
	_ = removeIfRegular(tmp)
	err := writeNewState(tmp, st)
	if err == nil {
		if err = os.Rename(tmp, path+StateSuffix); err != nil {
			os.Remove(tmp)
		}
	}
	if err != nil {
		return fmt.Errorf("write capture state: %w", err)
	}
	return nil
}

// writeNewState writes st as JSON to a new file name (mode 0600, failing if
// anything is there, never through a symlink); on a failed write it removes
// the file again.
func writeNewState(name string, st *State) error {
	b, err := json.MarshalIndent(st, "", " ")
	if err != nil {
		return err
	}
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL|oNoFollow, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(append(b, '\n'))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(name)
	}
	return err
}

// removeIfRegular removes name only when it is a regular file.
func removeIfRegular(name string) error {
	fi, err := os.Lstat(name)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file: left alone", name)
	}
	return os.Remove(name)
}
