package codegen

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"strings"

	"kurz.dev/pkg/linkcode"
)

// FromURLCandidates is how many candidate codes a tenant's URL can have:
// candidates 0 to FromURLCandidates-1. Each link the tenant makes from the
// URL holds one for good (a disabled, expired, replaced or deleted link
// keeps its code, which is never reused), and a candidate held by another
// link (another tenant's, or of another URL) is skipped, so this is about
// how often one URL can be shortened anew.
const FromURLCandidates = 1 << 30

// fromURLWindow is how many candidates right after the last one known taken
// FreeCandidate's first look checks one by one: a URL shortened anew a few
// times finds its next code there, in one query.
const fromURLWindow = 8

// fromURLProbes is how many candidates a later look of FreeCandidate checks
// at most (one query): each look narrows the run of taken candidates it
// searches by that much, so that a URL shortened anew a million times
// costs a handful of queries, not a million.
const fromURLProbes = 32

// FromURLLooks bounds the looks (queries) of one FreeCandidate: the first
// brackets the end of the run of taken candidates to within a power of two,
// and each later one divides that by fromURLProbes+1.
const FromURLLooks = 8

// FreeCandidate finds a free candidate at or after from (the first one,
// when the taken ones before it are a run, as a tenant's successive links
// of a URL are): taken reports, in one query, which of the candidates
// (their numbers) are held by a link. ok is false when none is free. It
// calls taken at most FromURLLooks times, with at most 40 candidates each,
// whatever the number of candidates taken: a stranger who shortens one URL
// anew again and again cannot make one create search without bound.
func FreeCandidate(from int, taken func(attempts []int) ([]bool, error)) (attempt int, ok bool, err error) {
	from = max(from, 0)
	if from >= FromURLCandidates {
		return 0, false, nil
	}
	// The first look: the next few candidates, then candidates at doubling
	// distances and the last one, which bracket a longer run.
	var probes []int
	for i := from; i < from+fromURLWindow && i < FromURLCandidates; i++ {
		probes = append(probes, i)
	}
	for d := fromURLWindow; d < FromURLCandidates-from-1; d *= 2 {
		probes = append(probes, from+d)
	}
	if last := FromURLCandidates - 1; probes[len(probes)-1] != last {
		probes = append(probes, last)
	}
	// lo is the last candidate known taken, hi the first known free (-1:
	// none yet); those between are not known.
	lo, hi := from-1, -1
	for range FromURLLooks {
		held, err := taken(probes)
		if err != nil {
			return 0, false, err
		}
		if len(held) != len(probes) {
			return 0, false, fmt.Errorf("from-url codes: %d answers for %d candidates", len(held), len(probes))
		}
		for i, p := range probes {
			if !held[i] {
				hi = p
				break
			}
			lo = p
		}
		switch {
		case hi < 0:
			return 0, false, nil
		case hi-lo == 1:
			return hi, true, nil
		}
		// gap candidates lie between lo and hi: look at up to
		// fromURLProbes of them, evenly spread.
		gap := hi - lo - 1
		n := min(gap, fromURLProbes)
		probes = probes[:0]
		for j := 1; j <= n; j++ {
			probes = append(probes, lo+j*(gap+1)/(n+1))
		}
	}
	// Not narrowed down to the first free candidate (only if the
	// candidates taken are no run): hi is free all the same.
	return hi, true, nil
}

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

// Candidate returns candidate attempt (0 to FromURLCandidates-1) of tenant's
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
