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
type Sealer struct{ aead cipher.AEAD }

// errUnseal is what a secret sealed under another key gives.
var errUnseal = errors.New("the signing secret cannot be opened (KURZ_SHORTENER_WEBHOOK_KEY changed?)")

// NewSealer keys a Sealer with SHA-256(label, key).
func NewSealer(key string) (*Sealer, error) {
	k := sha256.Sum256([]byte("kurz webhook secrets\x00" + key))
	block, err := aes.NewCipher(k[:])
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &Sealer{aead: aead}, nil
}

// Seal returns nonce || ciphertext of secret, bound to the subscription id.
func (s *Sealer) Seal(id, secret string) []byte {
	nonce := make([]byte, s.aead.NonceSize(), s.aead.NonceSize()+len(secret)+s.aead.Overhead())
	_, _ = rand.Read(nonce)
	return s.aead.Seal(nonce, nonce, []byte(secret), []byte(id))
}

// Open reverses Seal for the same id.
func (s *Sealer) Open(id string, sealed []byte) (string, error) {
	n := s.aead.NonceSize()
	if len(sealed) < n {
		return "", errUnseal
	}
	b, err := s.aead.Open(nil, sealed[:n], sealed[n:], []byte(id))
	if err != nil {
		return "", errUnseal
	}
	return string(b), nil
}
