// Package buildinfo is what a kurz binary knows of its build: the release
// version, the commit and the build time. make release sets them with
//
//	-ldflags "-X kurz.dev/pkg/buildinfo.Version=v1.2.3
//	          -X kurz.dev/pkg/buildinfo.Commit=<sha>
//	          -X kurz.dev/pkg/buildinfo.Date=<RFC 3339>"
//
// A plain go build leaves Version "dev" and takes the commit and its time
// from the module's VCS stamp when there is one.
package buildinfo

import (
	"runtime"
	"runtime/debug"
)

// Set at link time (see the package comment); never written at run time.
var (
	// Version is the release, e.g. v0.3.0; "dev" for a build outside make release.
	Version = "dev"
	// Commit is the full commit hash the binary was built from; "" if unknown.
	Commit = ""
	// Date is when the binary was built (RFC 3339); "" if unknown.
	Date = ""
)

// Info is one binary's build information.
type Info struct {
	Version string `json:"version"`
	Commit  string `json:"commit"`
	Date    string `json:"date"`
	Go      string `json:"go"`
}

// Get returns the build information: the linker's values, with the commit
// and its time from the Go toolchain's VCS stamp where the linker set none.
func Get() Info {
	info := Info{Version: Version, Commit: Commit, Date: Date, Go: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			switch {
			case s.Key == "vcs.revision" && info.Commit == "":
				info.Commit = s.Value
			case s.Key == "vcs.time" && info.Date == "":
				info.Date = s.Value
			}
		}
	}
	return info
}

// ShortCommit is the commit's first 12 hex digits, or "" if unknown.
func (i Info) ShortCommit() string {
	if len(i.Commit) > 12 {
		return i.Commit[:12]
	}
	return i.Commit
}
