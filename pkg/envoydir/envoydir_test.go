package envoydir

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Files of over 1 MiB together are refused while the directory is read,
// naming the file that went over, whatever each one's size.
func TestReadRefusesFilesOverAMiBTogether(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"a.yaml", "b.yaml"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(strings.Repeat("#", MaxBytes/2)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if files, err := Read(dir); err != nil || len(files) != 2 {
		t.Fatalf("two files of exactly 1 MiB together: %d files, %v", len(files), err)
	}
	if err := os.WriteFile(filepath.Join(dir, "c.yaml"), []byte("#"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(dir); err == nil || !strings.Contains(err.Error(), "c.yaml: the files come to over 1048576 bytes") {
		t.Errorf("one byte more: got %v, want c.yaml refused", err)
	}
}

// A name is one a directory lists: no path, control character or dot
// file, at most 255 bytes.
func TestCheckNameRefusesWhatNoDirectoryListing(t *testing.T) {
	for _, name := range []string{"edge.yaml", "ratelimit.conf", "README", strings.Repeat("a", MaxNameLen)} {
		if err := CheckName(name); err != nil {
			t.Errorf("%q: %v", name, err)
		}
	}
	for _, name := range []string{"", "../edge.yaml", `a\b`, "a\nb", "a\x1b[2J", "..data", ".hidden", "\xff", strings.Repeat("a", MaxNameLen+1)} {
		if err := CheckName(name); err == nil {
			t.Errorf("%q: accepted", name)
		}
	}
}
