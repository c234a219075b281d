package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
)

// What the gateway sends reaches a terminal with every character a
// terminal acts on escaped, JSON-compatibly; text, newlines and tabs
// pass, also when a write splits a character.
func TestTerminalSafeEscapesControls(t *testing.T) {
	for in, want := range map[string]string{
		"code\tabc\n":                              "code\tabc\n",
		"\x1b]0;PWNED\x07\x1b[2J":                  `\u001b]0;PWNED\u0007\u001b[2J`,
		"a\u009b31mRED.example":                    `a\u009b31mRED.example`,
		"evil\u202emoc.example":                    `evil\u202emoc.example`,
		"caf\u00e9 \u65e5\u672c \U0001F600":        "caf\u00e9 \u65e5\u672c \U0001F600",
		"bad\xffbyte\x7f":                          `bad\ufffdbyte\u007f`,
		`{"longUrl":"https://x/` + "\u009b" + `"}`: `{"longUrl":"https://x/\u009b"}`,
	} {
		var out bytes.Buffer
		w := &terminalSafe{w: &out}
		b := []byte(in)
		for i := range b { // one byte a write: runes split across writes
			if n, err := w.Write(b[i : i+1]); n != 1 || err != nil {
				t.Fatalf("Write: %d, %v", n, err)
			}
		}
		if out.String() != want {
			t.Errorf("%q: wrote %q, want %q", in, out.String(), want)
		}
	}
	var out bytes.Buffer
	(&terminalSafe{w: &out}).Write([]byte(`{"host":"a` + "\u009b\u202e" + `b"}`))
	var v map[string]string
	if err := json.Unmarshal(out.Bytes(), &v); err != nil || v["host"] != "a\u009b\u202eb" {
		t.Errorf("escaped JSON %s: %v %q, want the same string back", out.Bytes(), err, v["host"])
	}
}

// An answer larger than kurzctl reads is refused with a clear error, not
// read into memory to its end.
func TestAnswerLargerThanTheBoundIsRefused(t *testing.T) {
	defer func(n int) { maxAnswerBody = n }(maxAnswerBody)
	maxAnswerBody = 1 << 10
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"code":"` + strings.Repeat("A", 4<<10) + `"}`))
	}))
	t.Cleanup(srv.Close)
	c := &ctl{t: t, env: map[string]string{"KURZ_CONFIG": filepath.Join(t.TempDir(), "config.yaml")}}
	r := c.run("--url", srv.URL, "--api-key", "k", "links", "get", "abc1234")
	if r.code != exitError || !strings.Contains(r.stderr, "the answer is larger than") {
		t.Errorf("a 4 KiB answer over a 1 KiB bound: %s", r)
	}
}
