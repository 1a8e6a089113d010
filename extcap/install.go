package extcap

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// LauncherName is the file Install writes into the extcap folder.
const LauncherName = "udskit"

// launcherMark is the launcher's second line: Install overwrites and
// Uninstall removes only a file that carries it.
const launcherMark = "# udskit extcap launcher: written by 'udskit extcap --install'"

// Folder returns the user's personal extcap folder, as the Wireshark
// installed here reports it (tshark -G folders): "Personal Extcap path"
// where Wireshark lists one (4.2 and later), else "Personal
// configuration"/extcap, which Wireshark 3.x and 4.0 search. tshark is
// the program to ask ("" looks for tshark on PATH).
func Folder(ctx context.Context, tshark string) (string, error) {
	if tshark == "" {
		p, err := exec.LookPath("tshark")
		if err != nil {
			return "", fmt.Errorf("extcap: tshark is not installed, so Wireshark's folders are unknown: install Wireshark's tshark, or give the folder (Wireshark: Help > About > Folders, \"Personal Extcap path\"): %w", err)
		}
		tshark = p
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, tshark, "-G", "folders").Output()
	if err != nil {
		return "", fmt.Errorf("extcap: %s -G folders: %w", tshark, err)
	}
	return folderFrom(out)
}

func folderFrom(out []byte) (string, error) {
	var conf string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		switch strings.ToLower(k) {
		case "personal extcap path":
			if v != "" {
				return v, nil
			}
		case "personal configuration":
			conf = v
		}
	}
	if conf == "" {
		return "", errors.New("extcap: tshark -G folders names no personal folder")
	}
	return filepath.Join(conf, "extcap"), nil
}

// InstallOptions configures Install.
type InstallOptions struct {
	// Dir is the extcap folder. Default: Folder(ctx, "").
	Dir string
	// Binary is the udskit executable the launcher runs. Default: this
	// process's executable.
	Binary string
}

// Install writes the launcher (a two-line sh script running
// `BINARY extcap ARGS`) into the extcap folder, creating the folder
// (0700) if needed, and returns its path. An existing file of that name is
// replaced only if it is an earlier udskit launcher.
func Install(ctx context.Context, o InstallOptions) (string, error) {
	dir, bin, err := o.resolve(ctx)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("extcap: %w", err)
	}
	dst := filepath.Join(dir, LauncherName)
	if err := checkOurs(dst); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	script := "#!/bin/sh\n" + launcherMark + "\nexec " + shellQuote(bin) + " extcap \"$@\"\n"
	tmp, err := os.CreateTemp(dir, ".udskit-launcher-*")
	if err != nil {
		return "", fmt.Errorf("extcap: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.WriteString(script); err != nil {
		tmp.Close()
		return "", fmt.Errorf("extcap: %w", err)
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return "", fmt.Errorf("extcap: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return "", fmt.Errorf("extcap: %w", err)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return "", fmt.Errorf("extcap: %w", err)
	}
	return dst, nil
}

// Uninstall removes the launcher Install wrote and returns its path; a
// file there that is not ours is left alone (an error says so).
func Uninstall(ctx context.Context, o InstallOptions) (string, error) {
	dir := o.Dir
	if dir == "" {
		var err error
		if dir, err = Folder(ctx, ""); err != nil {
			return "", err
		}
	}
	dst := filepath.Join(dir, LauncherName)
	if err := checkOurs(dst); err != nil {
		return dst, err
	}
	return dst, os.Remove(dst)
}

func (o InstallOptions) resolve(ctx context.Context) (dir, bin string, err error) {
	dir, bin = o.Dir, o.Binary
	if dir == "" {
		if dir, err = Folder(ctx, ""); err != nil {
			return "", "", err
		}
	}
	if bin == "" {
		if bin, err = os.Executable(); err != nil {
			return "", "", fmt.Errorf("extcap: cannot name this program for the launcher: %w", err)
		}
	}
	if bin, err = filepath.Abs(bin); err != nil {
		return "", "", fmt.Errorf("extcap: %w", err)
	}
	return dir, bin, nil
}

// checkOurs returns nil when path is a regular file (not a symlink)
// holding launcherMark, fs.ErrNotExist when there is nothing there, and
// an error saying what to do otherwise.
func checkOurs(path string) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return err
	}
	if fi.Mode().IsRegular() && fi.Size() < 4096 {
		if b, err := os.ReadFile(path); err == nil && bytes.Contains(b, []byte(launcherMark)) {
			return nil
		}
	}
	return fmt.Errorf("extcap: %s exists and is not a udskit launcher: remove it yourself, or install into another folder (--dir)", path)
}

// shellQuote quotes s for sh: in single quotes, each single quote in s
// closed, escaped with a backslash and reopened.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
