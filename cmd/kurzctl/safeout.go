package main

import (
	"fmt"
	"io"
	"os"
	"unicode"
	"unicode/utf8"
)

// terminalSafe writes to a terminal what the gateway sent, with the
// characters a terminal would act on escaped: C0 controls but newline and
// tab (ESC starts colour, title and clear-screen sequences), DEL, C1
// controls (U+009B is an 8-bit CSI), and the bidi controls that make text
// read other than it is (U+202E), each as \u followed by four hex digits;
// a byte that is not UTF-8 as U+FFFD's escape. The escapes are JSON's, so
// -o json stays valid JSON with the same meaning. main wraps stdout and
// stderr in it when they are terminals; a pipe or a file gets the bytes.
type terminalSafe struct {
	w       io.Writer
	pending []byte // an incomplete UTF-8 sequence at the end of a write
	buf     []byte
}

func (t *terminalSafe) Write(p []byte) (int, error) {
	in := append(t.pending, p...)
	t.pending = nil
	out := t.buf[:0]
	for len(in) > 0 {
		if !utf8.FullRune(in) {
			t.pending = append([]byte(nil), in...)
			break
		}
		r, size := utf8.DecodeRune(in)
		switch {
		case r == utf8.RuneError && size == 1:
			out = append(out, `\ufffd`...)
		case unsafeRune(r):
			out = fmt.Appendf(out, `\u%04x`, r)
		default:
			out = append(out, in[:size]...)
		}
		in = in[size:]
	}
	t.buf = out
	if _, err := t.w.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// unsafeRune reports whether a terminal could act on r rather than show it.
func unsafeRune(r rune) bool {
	switch {
	case r == '\n' || r == '\t':
		return false
	case r < 0x20 || r == 0x7f || (r >= 0x80 && r <= 0x9f):
		return true
	}
	return unicode.Is(unicode.Bidi_Control, r)
}

// isTerminal reports whether f is a character device (a terminal).
func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// forTerminal returns w wrapped in terminalSafe when f, the file behind
// it, is a terminal.
func forTerminal(f *os.File) io.Writer {
	if isTerminal(f) {
		return &terminalSafe{w: f}
	}
	return f
}
