package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"kurz.dev/pkg/buildinfo"
)

// The release ships kurzctl and every service: a new folder in services/
// with a main package fails this test until it is in binaries.
func TestReleaseShipsEveryService(t *testing.T) {
	want := map[string]bool{"./cmd/kurzctl": true}
	entries, err := os.ReadDir(filepath.Join("..", "..", "services"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if _, err := os.Stat(filepath.Join("..", "..", "services", e.Name(), "main.go")); err == nil {
			want["./services/"+e.Name()] = true
		}
	}
	if len(want) != 6 {
		t.Errorf("found %d programs, want kurzctl and five services: %v", len(want), want)
	}
	got := map[string]bool{}
	for _, b := range binaries {
		got[b.pkg] = true
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("release builds %v, want %v", got, want)
	}
}

// Every binary is built for linux and darwin on amd64 and arm64.
func TestReleaseCoversEveryPlatform(t *testing.T) {
	got := map[platform]bool{}
	for _, p := range platforms {
		got[p] = true
	}
	for _, goos := range []string{"linux", "darwin"} {
		for _, arch := range []string{"amd64", "arm64"} {
			if !got[platform{goos, arch}] {
				t.Errorf("no %s/%s build", goos, arch)
			}
		}
	}
}

// The -X flags name pkg/buildinfo's variables (a moved package would
// silently leave every release "dev").
func TestLdflagsSetBuildinfo(t *testing.T) {
	if pkg := reflect.TypeOf(buildinfo.Info{}).PkgPath(); pkg != buildinfoPkg {
		t.Fatalf("buildinfo is %s, ldflags set %s", pkg, buildinfoPkg)
	}
	flags := ldflags("v1.2.3", "abc", "2026-12-04T00:00:00Z")
	for _, want := range []string{buildinfoPkg + ".Version=v1.2.3", buildinfoPkg + ".Commit=abc", buildinfoPkg + ".Date=2026-12-04T00:00:00Z"} {
		if !strings.Contains(flags, want) {
			t.Errorf("ldflags %q lack %q", flags, want)
		}
	}
}

// A version lands in file names and flags: no paths, spaces or quotes.
func TestVersionIsBounded(t *testing.T) {
	for _, v := range []string{"v0.3.0", "v1.0.0-rc.1", "0.1.0+build.5", "v0.3.0-4-gabcdef0-dirty"} {
		if !versionRE.MatchString(v) {
			t.Errorf("%q refused", v)
		}
	}
	for _, v := range []string{"", "../x", "v1 -X main.x=y", "v1/2", "v1'", strings.Repeat("1", 70)} {
		if versionRE.MatchString(v) {
			t.Errorf("%q accepted", v)
		}
	}
}

// checksums.txt is what sha256sum -c checks.
func TestChecksumsVerify(t *testing.T) {
	if _, err := exec.LookPath("sha256sum"); err != nil {
		t.Fatal("sha256sum is not installed (coreutils)")
	}
	dir := t.TempDir()
	for name, body := range map[string]string{"b_v1_linux_amd64": "bee", "a_v1_darwin_arm64": "ay"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	sums, err := checksums(dir, []string{"b_v1_linux_amd64", "a_v1_darwin_arm64"})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "checksums.txt"), sums, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sha256sum", "-c", "checksums.txt")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sha256sum -c: %v\n%s", err, out)
	}
	if first, _, _ := strings.Cut(string(sums), "\n"); !strings.HasSuffix(first, "  a_v1_darwin_arm64") {
		t.Errorf("not sorted by name:\n%s", sums)
	}
}

// .ko.yaml (make images) builds every service's image for linux on amd64
// and arm64, with the build information linked in as make release does.
func TestKoBuildsEveryService(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", ".ko.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var ko struct {
		DefaultBaseImage string   `json:"defaultBaseImage"`
		DefaultPlatforms []string `json:"defaultPlatforms"`
		Builds           []struct {
			ID      string   `json:"id"`
			Main    string   `json:"main"`
			Env     []string `json:"env"`
			Flags   []string `json:"flags"`
			Ldflags []string `json:"ldflags"`
		} `json:"builds"`
	}
	if err := yaml.UnmarshalStrict(raw, &ko); err != nil {
		t.Fatalf(".ko.yaml: %v", err)
	}
	if !slices.Equal(ko.DefaultPlatforms, []string{"linux/amd64", "linux/arm64"}) {
		t.Errorf("platforms %v", ko.DefaultPlatforms)
	}
	if !strings.HasPrefix(ko.DefaultBaseImage, "gcr.io/distroless/static") {
		t.Errorf("base %q: want the Dockerfile's distroless static", ko.DefaultBaseImage)
	}
	built := map[string]bool{}
	for _, b := range ko.Builds {
		built[b.Main] = true
		ld := strings.Join(b.Ldflags, " ")
		for _, v := range []string{".Version=", ".Commit=", ".Date="} {
			if !strings.Contains(ld, buildinfoPkg+v) {
				t.Errorf("%s: ldflags %q do not set %s%s", b.ID, ld, buildinfoPkg, v)
			}
		}
		if !slices.Contains(b.Env, "CGO_ENABLED=0") {
			t.Errorf("%s: not static (CGO_ENABLED=0)", b.ID)
		}
	}
	for _, b := range binaries {
		if strings.HasPrefix(b.pkg, "./services/") && !built[b.pkg] {
			t.Errorf(".ko.yaml builds no image of %s", b.pkg)
		}
	}
}
