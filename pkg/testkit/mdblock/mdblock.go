// Package mdblock reads the fenced code blocks of a Markdown document, for
// the tests that run a document's examples verbatim.
//
// It knows only what kurz's documents use: blocks fenced by a line that
// starts with three backticks at the left margin (its info string, the
// rest of the line, is the block's language) and closed by a line that is
// three backticks alone; "## " headings name sections. Indented fences,
// tildes and longer fences are not read as fences.
package mdblock

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

const fence = "```"

// Block is one fenced code block of a document.
type Block struct {
	// Lang is the opening fence's info string ("sh", "yaml"); "" for a
	// bare fence.
	Lang string
	// Code is the lines between the fences, each ending in "\n"; "" for an
	// empty block.
	Code string
	// Section is the "## " heading line the block is under ("## Subscribing"),
	// "" before the first.
	Section string
	// Before is the document's text between the previous block's closing
	// fence (or the document's start) and this block's opening fence:
	// the prose that introduces it, blank when the block follows another
	// directly.
	Before string
	// Line and End are the 1-based lines of the opening and closing fences.
	Line, End int
}

// Parse returns the fenced blocks of doc in order. A fence that is never
// closed is an error: the block would silently run to the end.
func Parse(doc string) ([]Block, error) {
	lines := strings.Split(strings.TrimSuffix(doc, "\n"), "\n")
	var blocks []Block
	section, before := "", 0 // before: the index of the first line after the last block
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSuffix(lines[i], "\r")
		if strings.HasPrefix(l, "## ") {
			section = l
			continue
		}
		if !strings.HasPrefix(l, fence) {
			continue
		}
		b := Block{
			Lang:    strings.TrimSpace(strings.TrimPrefix(l, fence)),
			Section: section,
			Before:  joinLines(lines[before:i]),
			Line:    i + 1,
		}
		start := i + 1
		for i++; i < len(lines) && strings.TrimSuffix(lines[i], "\r") != fence; i++ {
		}
		if i == len(lines) {
			return blocks, fmt.Errorf("line %d: the %s%s block is never closed", b.Line, fence, b.Lang)
		}
		b.Code, b.End, before = joinLines(lines[start:i]), i+1, i+1
		blocks = append(blocks, b)
	}
	return blocks, nil
}

// joinLines is lines, each ending in "\n".
func joinLines(lines []string) string {
	if len(lines) == 0 {
		return ""
	}
	return strings.Join(lines, "\n") + "\n"
}

// Read returns the fenced blocks of the document at path, failing the test
// when it cannot be read or a fence is never closed.
func Read(t testing.TB, path string) []Block {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := Parse(string(b))
	if err != nil {
		t.Fatalf("%s %v", path, err)
	}
	return blocks
}

// In returns the blocks of lang under the "## " heading section ("" for
// any section), in order.
func In(blocks []Block, section, lang string) []Block {
	var out []Block
	for _, b := range blocks {
		if b.Lang == lang && (section == "" || b.Section == section) {
			out = append(out, b)
		}
	}
	return out
}
