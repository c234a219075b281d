package codegen

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"strings"

	"kurz.dev/pkg/linkcode"
)

// FromURLAttempts is how many candidate codes a link made from its URL
// tries: a candidate held by another link (of another URL or tenant, or a
// deleted one, whose code is never reused) yields to the next.
const FromURLAttempts = 8

// FromURL derives the codes of links made from their URL
// (CODE_MODE_FROM_URL): candidate i of a tenant's URL is the first 64 bits
// of HMAC-SHA256(key, tenant, URL, i), reduced modulo 62^7 and written as 7
// base62 characters. The key is derived from the shortener's code key, so
// a stranger who knows a URL cannot compute its code (and so cannot probe
// whether a tenant shortened it), and every replica derives the same codes.
type FromURL struct {
	key []byte
}

// NewFromURL returns the deriver keyed by codeKey (KURZ_SHORTENER_CODE_KEY,
// at least linkcode.MinKeyLength bytes).
func NewFromURL(codeKey []byte) (*FromURL, error) {
	if len(codeKey) < linkcode.MinKeyLength {
		return nil, fmt.Errorf("from-url codes: key of %d bytes, want at least %d", len(codeKey), linkcode.MinKeyLength)
	}
	mac := hmac.New(sha256.New, codeKey)
	mac.Write([]byte("kurz codes from the URL, v1"))
	return &FromURL{key: mac.Sum(nil)}, nil
}

// Candidate returns candidate attempt (0 to FromURLAttempts-1) of tenant's
// longURL, which must be normalised (urlcheck.Policy.Normalize): the same
// URL written two ways is one URL only once normalised. Reserved words are
// never returned: such a candidate is replaced by the next derivation.
func (f *FromURL) Candidate(tenant, longURL string, attempt int) string {
	for salt := uint32(0); ; salt++ {
		mac := hmac.New(sha256.New, f.key)
		var n [4]byte
		binary.BigEndian.PutUint32(n[:], uint32(len(tenant)))
		mac.Write(n[:])
		mac.Write([]byte(tenant))
		mac.Write([]byte(longURL))
		binary.BigEndian.PutUint32(n[:], uint32(attempt))
		mac.Write(n[:])
		binary.BigEndian.PutUint32(n[:], salt)
		mac.Write(n[:])
		v := binary.BigEndian.Uint64(mac.Sum(nil)[:8]) % uint64(linkcode.CodeSpace)
		code := linkcode.Encode(int64(v))
		code = strings.Repeat(linkcode.Alphabet[:1], linkcode.SequentialLength-len(code)) + code
		if !linkcode.Reserved(code) {
			return code
		}
	}
}

// URLKey is what identifies a normalised long URL among a tenant's links
// made from their URL on one domain ("" for the default domain, else a
// normalised custom domain): the SHA-256 of the URL, or of
// "<domain>/<URL>" on a custom domain (linkstore.Link.URLKey), fixed in
// size whatever the URL's length, so a unique index can hold it. The same
// URL on two domains is two links.
func URLKey(domain, longURL string) []byte {
	if domain != "" {
		longURL = domain + "/" + longURL
	}
	sum := sha256.Sum256([]byte(longURL))
	return sum[:]
}
