package buildinfo

import (
	"runtime"
	"testing"
)

// The linker's values win over the VCS stamp, and the Go version is the
// running one.
func TestGetPrefersLinkerValues(t *testing.T) {
	defer func(v, c, d string) { Version, Commit, Date = v, c, d }(Version, Commit, Date)
	Version, Commit, Date = "v1.2.3", "0123456789abcdef0123", "2026-12-04T00:00:00Z"
	got := Get()
	want := Info{Version: "v1.2.3", Commit: "0123456789abcdef0123", Date: "2026-12-04T00:00:00Z", Go: runtime.Version()}
	if got != want {
		t.Fatalf("Get() = %+v, want %+v", got, want)
	}
	if s := got.ShortCommit(); s != "0123456789ab" {
		t.Errorf("ShortCommit() = %q", s)
	}
}

// Without -ldflags the version is "dev".
func TestGetDefaultsToDev(t *testing.T) {
	if got := Get().Version; got != "dev" {
		t.Fatalf("Version = %q, want dev (set only by -ldflags)", got)
	}
}
