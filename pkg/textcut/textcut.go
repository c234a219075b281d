// Package textcut cuts text to a bound in bytes without splitting a UTF-8
// character: what a service keeps of a stranger's text (Prefix), and what
// it repeats of one in a message, marked as cut (Echo).
package textcut

import (
	"strings"
	"unicode/utf8"
)

// Mark ends a string Echo cut: one character, which an input's own "..."
// cannot be taken for.
const Mark = "…"

// Prefix is the longest start of s of at most n bytes that does not end
// inside a UTF-8 sequence: s itself when it has n bytes or fewer, "" for n
// of 0 or less. Invalid bytes before the cut are kept as they are. It
// shares s's memory: clone it to keep it without the rest of s.
func Prefix(s string, n int) string {
	if len(s) <= n {
		return s
	}
	if n <= 0 {
		return ""
	}
	s = s[:n]
	// Only the last character can be cut short: find its first byte among
	// the last UTFMax-1 and drop it if the rest of its sequence is gone.
	for i := len(s) - 1; i >= 0 && i >= len(s)-(utf8.UTFMax-1); i-- {
		if utf8.RuneStart(s[i]) {
			if !utf8.FullRuneInString(s[i:]) {
				s = s[:i]
			}
			break
		}
	}
	return s
}

// Echo is s to repeat in a message: s itself when it has at most n bytes,
// else its Prefix of n bytes followed by Mark. Invalid UTF-8 in what it
// keeps becomes U+FFFD (the result kept to n bytes before the mark), so an
// echo is valid UTF-8 whatever it goes into: a protobuf string, JSON, a
// log line.
func Echo(s string, n int) string {
	p := Prefix(s, n)
	cut := len(p) < len(s)
	if !utf8.ValidString(p) {
		if p = strings.ToValidUTF8(p, string(utf8.RuneError)); len(p) > n {
			p, cut = Prefix(p, n), true
		}
	}
	if cut {
		p += Mark
	}
	return p
}
