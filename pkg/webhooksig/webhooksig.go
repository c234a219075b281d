// Package webhooksig signs and verifies kurz webhook deliveries.
//
// Every delivery is a POST whose Kurz-Signature header reads
//
//	Kurz-Signature: t=1733300000,v1=5257a869e7ecebeda32affa62cdca3fa51cad7e77a0e56ff536d0ce8e108d8bd
//
// where t is the Unix time of the attempt and v1 the lower-case hex
// HMAC-SHA256, keyed with the subscription's secret (the whole "whsec_..."
// string, as shown at creation), of t, a '.', and the raw request body.
// A receiver recomputes it over the body bytes it read (before any JSON
// decoding), compares in constant time, and refuses a t outside its replay
// window (Tolerance by default), then dedups deliveries by the body's "id".
// docs/webhooks.md has the same recipe in shell with openssl.
package webhooksig

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Header is the name of the signature header.
const Header = "Kurz-Signature"

// Tolerance is the replay window Verify applies: a signature older (or
// newer) than this is refused.
const Tolerance = 5 * time.Minute

// maxHeader bounds the header Verify parses.
const maxHeader = 1024

// Errors Verify returns.
var (
	ErrMalformed = errors.New("webhooksig: malformed Kurz-Signature header")
	ErrExpired   = errors.New("webhooksig: timestamp outside the replay window")
	ErrMismatch  = errors.New("webhooksig: signature does not match")
)

// Sign returns the Kurz-Signature header value for body sent at t.
func Sign(secret string, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac(secret, ts, body))
}

func mac(secret, ts string, body []byte) []byte {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(ts))
	m.Write([]byte{'.'})
	m.Write(body)
	return m.Sum(nil)
}

// Verify checks header against body and secret at now, with the replay
// window tolerance (0: Tolerance). Several v1 entries are accepted (any
// one matching suffices), so a sender may sign with two secrets at once.
func Verify(secret, header string, body []byte, now time.Time, tolerance time.Duration) error {
	if tolerance <= 0 {
		tolerance = Tolerance
	}
	if len(header) > maxHeader {
		return ErrMalformed
	}
	var ts string
	var sigs [][]byte
	for _, part := range strings.Split(header, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return ErrMalformed
		}
		switch k {
		case "t":
			ts = v
		case "v1":
			b, err := hex.DecodeString(v)
			if err != nil || len(b) != sha256.Size {
				return ErrMalformed
			}
			sigs = append(sigs, b)
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || len(sigs) == 0 {
		return ErrMalformed
	}
	if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
		return fmt.Errorf("%w: signed at %d, now %d", ErrExpired, sec, now.Unix())
	}
	want := mac(secret, ts, body)
	for _, s := range sigs {
		if hmac.Equal(s, want) {
			return nil
		}
	}
	return ErrMismatch
}
