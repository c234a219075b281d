package doccheck

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
)

// inlineLink matches an inline link or image, "[text](target)" or
// "[text](target "title")", capturing the target.
var inlineLink = regexp.MustCompile(`\]\(([^()\s]+)(?:\s+"[^"]*")?\)`)

// refLink matches a reference definition, "[name]: target".
var refLink = regexp.MustCompile(`(?m)^ {0,3}\[[^\]]+\]:\s+(\S+)`)

// codeSpan matches an inline code span, whose brackets are no link.
var codeSpan = regexp.MustCompile("`+[^`]*`+")

// htmlAnchor matches an HTML anchor a link can point at: <a id="x"> or
// <a name="x">.
var htmlAnchor = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)

// headingLink matches a link inside a heading, kept as its text.
var headingLink = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)

// notSlug matches what GitHub drops from a heading to make its anchor:
// anything but letters, marks, digits, connector punctuation, spaces and
// hyphens.
var notSlug = regexp.MustCompile(`[^\p{L}\p{M}\p{N}\p{Pc} -]`)

// prose returns doc's lines outside fenced code blocks, each with its
// 1-based line number; lines inside a fence are returned empty.
func prose(doc []byte) []string {
	lines := strings.Split(string(doc), "\n")
	fence := ""
	for i, l := range lines {
		t := strings.TrimLeft(l, " ")
		switch {
		case fence == "" && (strings.HasPrefix(t, "```") || strings.HasPrefix(t, "~~~")):
			fence = t[:3]
			lines[i] = ""
		case fence != "":
			if strings.HasPrefix(t, fence) {
				fence = ""
			}
			lines[i] = ""
		}
	}
	return lines
}

// anchors returns the anchors of a Markdown document as GitHub makes them:
// each heading's text in lower case, without punctuation, spaces as
// hyphens, "-1", "-2", ... after a repeated one; and its HTML anchors.
func anchors(doc []byte) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, l := range prose(doc) {
		for _, m := range htmlAnchor.FindAllStringSubmatch(l, -1) {
			out[m[1]] = true
		}
		level := len(l) - len(strings.TrimLeft(l, "#"))
		if level == 0 || level > 6 || !strings.HasPrefix(l[level:], " ") {
			continue
		}
		text := headingLink.ReplaceAllString(strings.TrimSpace(l[level:]), "$1")
		slug := strings.ReplaceAll(notSlug.ReplaceAllString(strings.ToLower(text), ""), " ", "-")
		if n := seen[slug]; n > 0 {
			out[fmt.Sprintf("%s-%d", slug, n)] = true
		} else {
			out[slug] = true
		}
		seen[slug]++
	}
	return out
}

// links returns the targets of doc's links outside code, with their line
// numbers, in order.
func links(doc []byte) (targets []string, lines []int) {
	for i, l := range prose(doc) {
		l = codeSpan.ReplaceAllString(l, "")
		for _, m := range inlineLink.FindAllStringSubmatch(l, -1) {
			targets, lines = append(targets, m[1]), append(lines, i+1)
		}
		for _, m := range refLink.FindAllStringSubmatch(l, -1) {
			targets, lines = append(targets, m[1]), append(lines, i+1)
		}
	}
	return targets, lines
}

// linkProblems checks the relative links of the Markdown files (paths
// from root, slash-separated): each must name a file or folder that
// exists, and its #anchor, if any, a heading or HTML anchor of the
// Markdown file it names (the file itself for "#anchor" alone). Links
// with a scheme (https:, mailto:) are not checked.
func linkProblems(root string, files []string) ([]string, error) {
	var out []string
	docs := map[string][]byte{}
	read := func(p string) ([]byte, error) {
		if b, ok := docs[p]; ok {
			return b, nil
		}
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(p)))
		if err == nil {
			docs[p] = b
		}
		return b, err
	}
	for _, f := range files {
		doc, err := read(f)
		if err != nil {
			return nil, err
		}
		targets, lines := links(doc)
		for i, t := range targets {
			if strings.Contains(t, ":") && !strings.HasPrefix(t, "#") {
				continue // a scheme: https://, mailto:
			}
			p, anchor, _ := strings.Cut(t, "#")
			p = strings.TrimSuffix(p, "/")
			target := f
			if p != "" {
				target = path.Clean(path.Join(path.Dir(f), p))
			}
			where := fmt.Sprintf("%s:%d: %s", f, lines[i], t)
			if strings.HasPrefix(target, "../") || target == ".." {
				out = append(out, where+": leaves the repository")
				continue
			}
			if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(target))); err != nil {
				out = append(out, where+": no such file or folder")
				continue
			}
			if anchor == "" {
				continue
			}
			if !strings.HasSuffix(target, ".md") {
				out = append(out, where+": an anchor into a file that is not Markdown")
				continue
			}
			b, err := read(target)
			if err != nil {
				return nil, err
			}
			if !anchors(b)[anchor] {
				out = append(out, where+": "+target+" has no heading or anchor #"+anchor)
			}
		}
	}
	return out, nil
}

// markdownFiles lists the Markdown files under root that the repository
// keeps (not in ignored folders), slash-separated from root.
func markdownFiles(root string) ([]string, error) {
	var found []string
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != root && ignored[d.Name()] {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".md") {
			return nil
		}
		rel, err := filepath.Rel(root, p)
		found = append(found, filepath.ToSlash(rel))
		return err
	})
	return found, err
}
