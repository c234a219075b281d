package quotaguard_test

import (
	"os"
	"strings"
	"testing"
)

// The limiter's README shows the lines a Go service adds ("From a Go
// service"); the examples run them. Each line of each README block must be
// a line of its example, in the same order (the examples add the error
// checks the README leaves out).
func TestREADMEBlocksAreTheExamples(t *testing.T) {
	readme, err := os.ReadFile("../../services/limiter/README.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	for marker, example := range map[string]string{
		"quotaguard.Middleware(":             "ExampleMiddleware",
		"quotaguard.UnaryServerInterceptor(": "ExampleUnaryServerInterceptor",
	} {
		block := goBlock(t, string(readme), marker)
		body := funcBody(t, string(src), example)
		at := 0
		for _, line := range strings.Split(block, "\n") {
			line = strings.TrimSpace(line)
			if line == "" {
				continue
			}
			i := indexFrom(body, line, at)
			if i < 0 {
				t.Errorf("the README's line %q is not in %s after the lines before it: update one or the other", line, example)
				continue
			}
			at = i + 1
		}
	}
}

// goBlock is the README's first ```go block holding marker.
func goBlock(t *testing.T, readme, marker string) string {
	t.Helper()
	for _, block := range strings.Split(readme, "```go\n")[1:] {
		block, _, _ = strings.Cut(block, "```")
		if strings.Contains(block, marker) {
			return block
		}
	}
	t.Fatalf("the limiter's README has no ```go block holding %q", marker)
	return ""
}

// funcBody is the trimmed lines of the function name in src.
func funcBody(t *testing.T, src, name string) []string {
	t.Helper()
	_, rest, ok := strings.Cut(src, "\nfunc "+name+"() {\n")
	if !ok {
		t.Fatalf("example_test.go has no %s", name)
	}
	body, _, _ := strings.Cut(rest, "\n}\n")
	lines := strings.Split(body, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimSpace(l)
	}
	return lines
}

func indexFrom(lines []string, line string, from int) int {
	for i := from; i < len(lines); i++ {
		if lines[i] == line {
			return i
		}
	}
	return -1
}
