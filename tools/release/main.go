// Command release builds kurz's release: kurzctl and the five services for
// linux and darwin on amd64 and arm64, static, with the version, commit and
// build date linked into pkg/buildinfo; a CycloneDX SBOM of each binary's
// modules (with cyclonedx-gomod, which make release installs); and a SHA-256
// checksum file over them all. make release runs it:
//
//	go run ./tools/release -version v0.3.0 -out dist -sbom bin/cyclonedx-gomod
//
// Its output, in -out:
//
//	<binary>_<version>_<os>_<arch>           the binaries (4 platforms × 6)
//	<binary>_<version>_<os>_<arch>.cdx.json  each one's SBOM
//	checksums.txt                            sha256sum -c format, over them all
package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

// binary is one program of the release.
type binary struct {
	name string // the file's name, e.g. kurzctl or kurz-limiter
	pkg  string // its main package, e.g. ./services/limiter
}

// binaries is what a release ships: the CLI and every service.
var binaries = []binary{
	{"kurzctl", "./cmd/kurzctl"},
	{"kurz-limiter", "./services/limiter"},
	{"kurz-shortener", "./services/shortener"},
	{"kurz-redirect", "./services/redirect"},
	{"kurz-analytics", "./services/analytics"},
	{"kurz-gateway", "./services/gateway"},
}

// platform is a GOOS/GOARCH pair.
type platform struct{ os, arch string }

// platforms are the release's targets.
var platforms = []platform{
	{"linux", "amd64"}, {"linux", "arm64"},
	{"darwin", "amd64"}, {"darwin", "arm64"},
}

// buildinfoPkg is where the version variables live (pkg/buildinfo).
const buildinfoPkg = "kurz.dev/pkg/buildinfo"

// versionRE bounds -version: it lands in file names and in -ldflags.
var versionRE = regexp.MustCompile(`^v?[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}$`)

func main() {
	version := flag.String("version", "", "the release version, e.g. v0.3.0 (required)")
	commit := flag.String("commit", "", "the commit built (default: git rev-parse HEAD)")
	out := flag.String("out", "dist", "the output directory (emptied first)")
	sbom := flag.String("sbom", "", "the cyclonedx-gomod binary; empty: no SBOMs")
	flag.Parse()
	if err := run(*version, *commit, *out, *sbom); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

func run(version, commit, out, sbom string) error {
	if !versionRE.MatchString(version) {
		return fmt.Errorf("-version %q: want a version like v0.3.0", version)
	}
	if commit == "" {
		b, err := exec.Command("git", "rev-parse", "HEAD").Output()
		if err != nil {
			return fmt.Errorf("git rev-parse HEAD: %w (or give -commit)", err)
		}
		commit = strings.TrimSpace(string(b))
	}
	date := time.Now().UTC().Format(time.RFC3339)
	if err := os.RemoveAll(out); err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	var files []string
	for _, p := range platforms {
		for _, b := range binaries {
			file := artifactName(b, version, p)
			cmd := exec.Command("go", "build", "-trimpath", "-ldflags", ldflags(version, commit, date), "-o", filepath.Join(out, file), b.pkg)
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+p.os, "GOARCH="+p.arch)
			cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
			fmt.Fprintf(os.Stderr, "build %s\n", file)
			if err := cmd.Run(); err != nil {
				return fmt.Errorf("build %s: %w", file, err)
			}
			files = append(files, file)
		}
	}
	if sbom != "" {
		// From each binary's embedded module list: the SBOM describes what
		// shipped, platform by platform, and needs no git (the source mode
		// of cyclonedx-gomod reads the version from git and fails in a
		// git worktree).
		for _, bin := range append([]string(nil), files...) {
			file := bin + ".cdx.json"
			cmd := exec.Command(sbom, "bin", "-json", "-version", version, "-output", filepath.Join(out, file), filepath.Join(out, bin))
			cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
			fmt.Fprintf(os.Stderr, "sbom %s\n", file)
			if err := cmd.Run(); err != nil {
				return fmt.Errorf("sbom %s: %w", file, err)
			}
			files = append(files, file)
		}
	}
	sums, err := checksums(out, files)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(out, "checksums.txt"), sums, 0o644)
}

// artifactName is a binary's file name in the release.
func artifactName(b binary, version string, p platform) string {
	return fmt.Sprintf("%s_%s_%s_%s", b.name, version, p.os, p.arch)
}

// ldflags strips the symbol tables and links the build information in.
func ldflags(version, commit, date string) string {
	return fmt.Sprintf("-s -w -X %[1]s.Version=%[2]s -X %[1]s.Commit=%[3]s -X %[1]s.Date=%[4]s", buildinfoPkg, version, commit, date)
}

// checksums is files' SHA-256 sums in sha256sum's format, sorted by name.
func checksums(dir string, files []string) ([]byte, error) {
	if len(files) == 0 {
		return nil, errors.New("nothing to sum")
	}
	sorted := append([]string(nil), files...)
	sort.Strings(sorted)
	var buf bytes.Buffer
	for _, f := range sorted {
		fh, err := os.Open(filepath.Join(dir, f))
		if err != nil {
			return nil, err
		}
		h := sha256.New()
		_, err = io.Copy(h, fh)
		fh.Close()
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(&buf, "%s  %s\n", hex.EncodeToString(h.Sum(nil)), f)
	}
	return buf.Bytes(), nil
}
