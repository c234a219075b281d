package webhook

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
)

// secretPrefix starts every signing secret, so a leaked one is recognisable.
const secretPrefix = "whsec_"

// newSecret returns a fresh signing secret: the prefix and 32 random bytes,
// base64url without padding (43 characters).
func newSecret() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return secretPrefix + base64.RawURLEncoding.EncodeToString(b)
}

// Sealer encrypts signing secrets at rest: the sender needs them in clear
// to sign, so they cannot be hashed like API keys; sealed, a copy of the
// table (a backup, a replica) does not give them away without the key.
// During a rotation it also opens what the previous key sealed.
type Sealer struct{ aead, previous cipher.AEAD }

// errUnseal is what a secret sealed under another key gives.
var errUnseal = errors.New("the signing secret cannot be opened (KURZ_SHORTENER_WEBHOOK_KEY changed without KURZ_SHORTENER_WEBHOOK_PREVIOUS_KEY?)")

// NewSealer keys a Sealer with SHA-256(label, key); previous, if not
// empty, is the key of a rotation's old secrets.
func NewSealer(key, previous string) (*Sealer, error) {
	aead, err := newAEAD(key)
	if err != nil {
		return nil, err
	}
	s := &Sealer{aead: aead}
	if previous != "" {
		if s.previous, err = newAEAD(previous); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func newAEAD(key string) (cipher.AEAD, error) {
	k := sha256.Sum256([]byte("kurz webhook secrets\x00" + key))
	block, err := aes.NewCipher(k[:])
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// Seal returns nonce || ciphertext of secret, bound to the subscription id.
func (s *Sealer) Seal(id, secret string) []byte {
	nonce := make([]byte, s.aead.NonceSize(), s.aead.NonceSize()+len(secret)+s.aead.Overhead())
	_, _ = rand.Read(nonce)
	return s.aead.Seal(nonce, nonce, []byte(secret), []byte(id))
}

// Open reverses Seal for the same id, under the key or the previous one.
func (s *Sealer) Open(id string, sealed []byte) (string, error) {
	secret, _, err := s.open(id, sealed)
	return secret, err
}

// open is Open, and says whether the secret was sealed under the previous
// key.
func (s *Sealer) open(id string, sealed []byte) (secret string, old bool, err error) {
	if b, ok := openWith(s.aead, id, sealed); ok {
		return string(b), false, nil
	}
	if s.previous != nil {
		if b, ok := openWith(s.previous, id, sealed); ok {
			return string(b), true, nil
		}
	}
	return "", false, errUnseal
}

func openWith(aead cipher.AEAD, id string, sealed []byte) ([]byte, bool) {
	n := aead.NonceSize()
	if len(sealed) < n {
		return nil, false
	}
	b, err := aead.Open(nil, sealed[:n], sealed[n:], []byte(id))
	return b, err == nil
}

// Rotating says whether there is a previous key to seal secrets away from.
func (s *Sealer) Rotating() bool { return s.previous != nil }
