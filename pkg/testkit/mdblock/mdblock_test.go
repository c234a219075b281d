package mdblock

import (
	"reflect"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	doc := strings.Join([]string{
		"# Title",   // 1
		"```",       // 2
		"bare",      // 3
		"```",       // 4
		"## One",    // 5
		"Run this:", // 6
		"```sh",     // 7
		"echo hi",   // 8
		"## not a heading inside a block",
		"```",      // 10
		"",         // 11
		"```text",  // 12
		"hi",       // 13
		"```",      // 14
		"## Two",   // 15
		"```yaml ", // 16
		"```",      // 17
		"tail",
	}, "\n") + "\n"
	got, err := Parse(doc)
	if err != nil {
		t.Fatal(err)
	}
	want := []Block{
		{Lang: "", Code: "bare\n", Section: "", Before: "# Title\n", Line: 2, End: 4},
		{Lang: "sh", Code: "echo hi\n## not a heading inside a block\n", Section: "## One", Before: "## One\nRun this:\n", Line: 7, End: 10},
		{Lang: "text", Code: "hi\n", Section: "## One", Before: "\n", Line: 12, End: 14},
		{Lang: "yaml", Code: "", Section: "## Two", Before: "## Two\n", Line: 16, End: 17},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Parse:\n got %+v\nwant %+v", got, want)
	}

	if got := In(got, "## One", "sh"); len(got) != 1 || got[0].Line != 7 {
		t.Errorf(`In("## One", "sh") = %+v, want the block at line 7`, got)
	}
	if got := In(got, "", "text"); len(got) != 1 || got[0].Line != 12 {
		t.Errorf(`In("", "text") = %+v, want the block at line 12`, got)
	}
	if got := In(got, "## Two", "sh"); len(got) != 0 {
		t.Errorf(`In("## Two", "sh") = %+v, want none`, got)
	}
}

func TestParseCRLF(t *testing.T) {
	got, err := Parse("## S\r\n```sh\r\necho\r\n```\r\n")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Lang != "sh" || got[0].Section != "## S" || got[0].End != 4 {
		t.Errorf("Parse of a CRLF document = %+v, want one sh block under ## S closed at line 4", got)
	}
}

func TestParseUnclosed(t *testing.T) {
	_, err := Parse("text\n```sh\necho\n")
	if err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("Parse of an unclosed fence: %v, want an error naming line 2", err)
	}
}
