// Package envoydir reads an envoyproxy/ratelimit runtime config directory
// as kurz does: the limiter's file source (KURZ_LIMITER_RULES_FILE naming
// a directory) and `kurzctl rules apply DIR`, which sends its files to the
// limiter in one request, so that both take the same files from it. Which
// of them are envoyproxy/ratelimit files, and what they say, the limiter
// alone judges (rulestore.FromEnvoyDir).
package envoydir

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Bounds of a directory: as many files as anyone keeps domains, and 1 MiB
// in all (a ConfigMap's bound, a rules file's).
const (
	MaxFiles   = 1000
	MaxBytes   = 1 << 20
	MaxNameLen = 255 // a file name's bound on every common file system
)

// File is one file of a directory: its name in it and its content.
type File struct {
	Name string
	Data []byte
}

// Read reads every file of dir but dot files (a mounted ConfigMap's
// ..data, as envoyproxy/ratelimit skips them with RUNTIME_IGNOREDOTFILES),
// whatever its name, as envoyproxy/ratelimit loads its runtime config
// directory: it takes a ratelimit.conf as a domain and refuses a README,
// so kurz does too. Symbolic links (a ConfigMap's files are) are followed;
// a subdirectory's files are envoyproxy/ratelimit's too, so one is refused
// rather than left out; other entries (sockets, devices) are skipped.
// Files come in name order.
func Read(dir string) ([]File, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var files []File
	total := 0
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") {
			continue
		}
		path := filepath.Join(dir, name)
		if info, err := os.Stat(path); err != nil {
			return nil, err
		} else if info.IsDir() {
			return nil, fmt.Errorf("%s: a subdirectory: envoyproxy/ratelimit reads the files under it too, kurz only the directory's own; move them up into %s", path, dir)
		} else if !info.Mode().IsRegular() {
			continue
		}
		if err := CheckName(name); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if len(files) == MaxFiles {
			return nil, fmt.Errorf("%s: over %d rule files", dir, MaxFiles)
		}
		data, err := readBounded(path, MaxBytes-total)
		if err != nil {
			return nil, err
		}
		total += len(data)
		files = append(files, File{Name: name, Data: data})
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%s: no rule files", dir)
	}
	return files, nil
}

// errTooLarge is the refusal of files over MaxBytes together.
func errTooLarge(path string) error {
	return fmt.Errorf("%s: the files come to over %d bytes (1 MiB, a ConfigMap's bound) together: split the domains over several directories", path, MaxBytes)
}

// readBounded reads path, refusing it once it is over room bytes (what
// the files before it left of MaxBytes), before reading it when its size
// says so (a file that grows meanwhile, or is not regular, is cut at the
// bound and refused all the same).
func readBounded(path string, room int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if info, err := f.Stat(); err == nil && info.Size() > int64(room) {
		return nil, errTooLarge(path)
	}
	data, err := io.ReadAll(io.LimitReader(f, int64(room)+1))
	if err != nil {
		return nil, err
	}
	if len(data) > room {
		return nil, errTooLarge(path)
	}
	return data, nil
}

// CheckName refuses a file name no directory Read reads gives: empty,
// over MaxNameLen bytes, not UTF-8, with a control character or a '/', or
// a dot file (Read skips those). Names are repeated in error messages, so
// one sent by a stranger is checked before it is.
func CheckName(name string) error {
	switch {
	case name == "":
		return errors.New("a file without a name")
	case len(name) > MaxNameLen:
		return fmt.Errorf("a file name of %d bytes, over %d", len(name), MaxNameLen)
	case !utf8.ValidString(name):
		return errors.New("a file name that is not UTF-8")
	case strings.ContainsFunc(name, unicode.IsControl):
		return fmt.Errorf("the file name %q has a control character", name)
	case strings.ContainsAny(name, `/\`):
		return fmt.Errorf("the file name %q has a '/' or '\\': give the names in the directory, not paths", name)
	case strings.HasPrefix(name, "."):
		return fmt.Errorf("the file name %q is a dot file, which a directory's reader skips (..data of a ConfigMap): rename it", name)
	}
	return nil
}
