// Package linkpass hashes and checks the passwords of password-protected
// links: Argon2id (RFC 9106) with the parameters OWASP recommends for
// interactive logins, encoded as a PHC string so parameters can change
// without invalidating stored hashes. The shortener hashes; the redirect
// service verifies.
package linkpass

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/crypto/argon2"
)

// Password length bounds, in characters.
const (
	MinLength = 8
	MaxLength = 128
)

// The parameters of new hashes: 19 MiB, two passes, one lane.
const (
	memoryKiB = 19 * 1024
	passes    = 2
	lanes     = 1
	saltBytes = 16
	keyBytes  = 32
)

// Bounds on the parameters Verify accepts from a stored hash, so a corrupt
// or hostile entry cannot make one check cost seconds or gigabytes.
const (
	maxMemoryKiB = 256 * 1024
	maxPasses    = 10
	maxLanes     = 8
)

// ErrMalformed reports a stored hash that is not an Argon2id PHC string this
// package can check.
var ErrMalformed = errors.New("linkpass: malformed password hash")

// Validate reports a password that cannot be set, in words for the caller.
func Validate(password string) error {
	if !utf8.ValidString(password) {
		return errors.New("the password must be valid UTF-8")
	}
	n := utf8.RuneCountInString(password)
	if n < MinLength || n > MaxLength {
		return fmt.Errorf("the password must be %d to %d characters long", MinLength, MaxLength)
	}
	// The redirect's password form is a single line of typed text: a
	// password with a control character (NUL, a tab, a line break) could
	// never be entered there, and the link would never open.
	if i := strings.IndexFunc(password, unicode.IsControl); i >= 0 {
		r, _ := utf8.DecodeRuneInString(password[i:])
		return fmt.Errorf("the password must not contain control characters (it has %U at byte %d): visitors could not type it", r, i)
	}
	return nil
}

// Hash returns the PHC string of password under a fresh random salt:
// $argon2id$v=19$m=19456,t=2,p=1$<salt>$<key>, unpadded standard base64.
func Hash(password string) (string, error) {
	if err := Validate(password); err != nil {
		return "", err
	}
	salt := make([]byte, saltBytes)
	if _, err := rand.Read(salt); err != nil {
		return "", fmt.Errorf("linkpass: salt: %w", err)
	}
	key := argon2.IDKey([]byte(password), salt, passes, memoryKiB, lanes, keyBytes)
	b64 := base64.RawStdEncoding
	return fmt.Sprintf("$argon2id$v=%d$m=%d,t=%d,p=%d$%s$%s",
		argon2.Version, memoryKiB, passes, lanes, b64.EncodeToString(salt), b64.EncodeToString(key)), nil
}

// Verify reports whether password matches the PHC string hash, comparing in
// constant time. A malformed hash is an error, never a match.
func Verify(hash, password string) (bool, error) {
	parts := strings.Split(hash, "$")
	if len(parts) != 6 || parts[0] != "" || parts[1] != "argon2id" {
		return false, ErrMalformed
	}
	var version int
	if _, err := fmt.Sscanf(parts[2], "v=%d", &version); err != nil || version != argon2.Version {
		return false, ErrMalformed
	}
	var m, t uint32
	var p uint8
	if _, err := fmt.Sscanf(parts[3], "m=%d,t=%d,p=%d", &m, &t, &p); err != nil ||
		m == 0 || m > maxMemoryKiB || t == 0 || t > maxPasses || p == 0 || p > maxLanes {
		return false, ErrMalformed
	}
	b64 := base64.RawStdEncoding
	salt, err := b64.DecodeString(parts[4])
	if err != nil || len(salt) < 8 {
		return false, ErrMalformed
	}
	want, err := b64.DecodeString(parts[5])
	if err != nil || len(want) < 16 || len(want) > 64 {
		return false, ErrMalformed
	}
	if len(password) > MaxLength*utf8.UTFMax {
		return false, nil
	}
	got := argon2.IDKey([]byte(password), salt, t, m, p, uint32(len(want)))
	return subtle.ConstantTimeCompare(got, want) == 1, nil
}
