// Package linkcode holds what every kurz component knows about short codes:
// the base62 alphabet, the keyed permutation that turns a block-allocated ID
// into its 7-character code (Permutation), the unbiased random codes, the
// charset and length any code or custom alias must have, and the words no
// code may take because a service serves them at the root of a public host.
// The design notes' sequential encoding (Sequential) names no link the
// shortener makes since codes are permuted; load tools name synthetic links
// with it.
package linkcode

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Alphabet is base62 in the order the notes use: digits, lower, upper. A
// sequential ID's code is its base62 numeral in this alphabet.
const Alphabet = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"

// SequentialLength is the length of every sequential code and the default
// length of random codes.
const SequentialLength = 7

// SequentialOffset (62^6) is added to a sequential ID before encoding, so the
// smallest code is "1000000" and every code up to 62^7-62^6 IDs later has
// exactly SequentialLength characters.
const SequentialOffset int64 = 56_800_235_584

// MaxSequentialID is the largest ID that still encodes to SequentialLength
// characters.
const MaxSequentialID int64 = 62*SequentialOffset - SequentialOffset - 1

// MinLength and MaxLength bound every code kurz serves: random codes (whose
// length is configurable within these bounds), sequential codes and custom
// aliases. A request path outside them cannot be a code.
const (
	MinLength = 4
	MaxLength = 32
)

// ErrOutOfRange means an ID does not fit in SequentialLength characters.
var ErrOutOfRange = errors.New("linkcode: sequential ID out of range")

// Sequential returns the design notes' code of an ID, base62(id + 62^6):
// 7 characters, in ID order. The shortener permutes its IDs instead
// (Permutation), so that codes cannot be walked from one another.
func Sequential(id int64) (string, error) {
	if id < 0 || id > MaxSequentialID {
		return "", fmt.Errorf("%w: %d", ErrOutOfRange, id)
	}
	return Encode(id + SequentialOffset), nil
}

// SequentialID reverses Sequential; ok is false for anything that is not a
// sequential code.
func SequentialID(code string) (id int64, ok bool) {
	if len(code) != SequentialLength {
		return 0, false
	}
	n, ok := Decode(code)
	if !ok || n < SequentialOffset {
		return 0, false
	}
	return n - SequentialOffset, true
}

// Encode writes n (n >= 0) in base62.
func Encode(n int64) string {
	if n == 0 {
		return Alphabet[:1]
	}
	var buf [11]byte // 62^11 > 2^63
	i := len(buf)
	for n > 0 {
		i--
		buf[i] = Alphabet[n%62]
		n /= 62
	}
	return string(buf[i:])
}

// Decode reads a base62 numeral; ok is false on a foreign character or an
// overflow.
func Decode(s string) (n int64, ok bool) {
	if s == "" || len(s) > 11 {
		return 0, false
	}
	for i := range len(s) {
		d := digit(s[i])
		if d < 0 {
			return 0, false
		}
		if n > (1<<63-1-int64(d))/62 {
			return 0, false
		}
		n = n*62 + int64(d)
	}
	return n, true
}

func digit(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'z':
		return int(c-'a') + 10
	case c >= 'A' && c <= 'Z':
		return int(c-'A') + 36
	}
	return -1
}

// Random returns length base62 characters read from r (crypto/rand.Reader
// when r is nil). Bytes of 248 and above are discarded rather than folded in
// with a modulo, so every character is exactly equally likely.
func Random(r io.Reader, length int) (string, error) {
	if r == nil {
		r = rand.Reader
	}
	out := make([]byte, 0, length)
	var buf [16]byte
	for len(out) < length {
		if _, err := io.ReadFull(r, buf[:]); err != nil {
			return "", fmt.Errorf("linkcode: random source: %w", err)
		}
		for _, b := range buf {
			if b >= 248 { // 248 = 4*62: the largest multiple of 62 that fits a byte
				continue
			}
			out = append(out, Alphabet[b%62])
			if len(out) == length {
				break
			}
		}
	}
	return string(out), nil
}

// Plausible reports whether s could be a code kurz issued: MinLength to
// MaxLength characters of base62, '-' or '_'. The redirect service answers
// anything else with 404 without touching a cache or a database.
func Plausible(s string) bool {
	if len(s) < MinLength || len(s) > MaxLength {
		return false
	}
	for i := range len(s) {
		if !aliasChar(s[i]) {
			return false
		}
	}
	return true
}

func aliasChar(c byte) bool {
	return digit(c) >= 0 || c == '-' || c == '_'
}

// reserved are names served, or likely to be served, at the root of a public
// kurz host (the redirect's and the gateway's ops and API routes, well-known
// files, future product pages). No code takes one, in any letter case.
var reserved = map[string]struct{}{
	"healthz": {}, "readyz": {}, "livez": {}, "metrics": {}, "debug": {},
	"v1": {}, "v2": {}, "api": {}, "apis": {}, "links": {}, "link": {}, "stats": {},
	"admin": {}, "login": {}, "logout": {}, "signin": {}, "signup": {}, "auth": {},
	"oauth": {}, "account": {}, "settings": {}, "dashboard": {}, "console": {},
	"docs": {}, "openapi": {}, "swagger": {}, "static": {}, "assets": {},
	"public": {}, "qr": {}, "favicon": {}, "robots": {}, "sitemap": {},
	"well-known": {}, "kurz": {}, "help": {}, "about": {}, "terms": {},
	"privacy": {}, "abuse": {}, "report": {}, "status": {}, "www": {},
	"openapi-json": {}, "grpc": {}, "graphql": {}, "health": {}, "ready": {},
}

// Reserved reports whether code is a reserved word (case-insensitive). Code
// generators skip such codes; custom aliases are refused.
func Reserved(code string) bool {
	_, ok := reserved[strings.ToLower(code)]
	return ok
}

// AliasProblem says why s cannot be a custom alias, or returns "" when it can:
// MinLength to MaxLength characters of base62, '-' or '_', starting and ending
// with a letter or digit, and not a reserved word.
func AliasProblem(s string) string {
	switch {
	case len(s) < MinLength || len(s) > MaxLength:
		return fmt.Sprintf("an alias has %d to %d characters", MinLength, MaxLength)
	case !Plausible(s):
		return "an alias uses only letters, digits, '-' and '_'"
	case digit(s[0]) < 0 || digit(s[len(s)-1]) < 0:
		return "an alias starts and ends with a letter or digit"
	case Reserved(s):
		return fmt.Sprintf("%q is reserved", s)
	}
	return ""
}
