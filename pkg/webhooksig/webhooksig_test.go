package webhooksig

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestSignThenVerify(t *testing.T) {
	at := time.Unix(1733300000, 0)
	body := []byte(`{"id":"evt_1","type":"link.created"}`)
	h := Sign("whsec_test", at, body)
	if !strings.HasPrefix(h, "t=1733300000,v1=") || len(h) != len("t=1733300000,v1=")+64 {
		t.Fatalf("header %q", h)
	}
	if err := Verify("whsec_test", h, body, at.Add(time.Minute), 0); err != nil {
		t.Fatalf("verify: %v", err)
	}
}

// TestKnownVector pins the construction: HMAC-SHA256(secret, "t.body"),
// the value `printf '%s' '1733300000.{}' | openssl dgst -sha256 -hmac whsec_test` prints.
func TestKnownVector(t *testing.T) {
	got := Sign("whsec_test", time.Unix(1733300000, 0), []byte("{}"))
	want := "t=1733300000,v1=80562776ee85d8113ece51eef2bfb46a6c1f59ed1af568b86b29ebc98be715d5"
	if got != want {
		t.Fatalf("Sign = %s, want %s (openssl's answer)", got, want)
	}
	if err := Verify("whsec_test", got, []byte("{}"), time.Unix(1733300000, 0), 0); err != nil {
		t.Fatal(err)
	}
}

func TestVerifyRefuses(t *testing.T) {
	at := time.Unix(1733300000, 0)
	body := []byte(`{"id":"evt_1"}`)
	h := Sign("whsec_a", at, body)
	for name, tc := range map[string]struct {
		secret, header string
		body           []byte
		now            time.Time
		want           error
	}{
		"other secret":     {"whsec_b", h, body, at, ErrMismatch},
		"changed body":     {"whsec_a", h, []byte(`{"id":"evt_2"}`), at, ErrMismatch},
		"replayed late":    {"whsec_a", h, body, at.Add(Tolerance + time.Second), ErrExpired},
		"from the future":  {"whsec_a", h, body, at.Add(-Tolerance - time.Second), ErrExpired},
		"no signature":     {"whsec_a", "t=1733300000", body, at, ErrMalformed},
		"no timestamp":     {"whsec_a", h[strings.Index(h, ",")+1:], body, at, ErrMalformed},
		"bad hex":          {"whsec_a", "t=1733300000,v1=zz", body, at, ErrMalformed},
		"garbage":          {"whsec_a", "hello", body, at, ErrMalformed},
		"oversized header": {"whsec_a", h + strings.Repeat(",v1=00", 200), body, at, ErrMalformed},
	} {
		t.Run(name, func(t *testing.T) {
			if err := Verify(tc.secret, tc.header, tc.body, tc.now, 0); !errors.Is(err, tc.want) {
				t.Fatalf("Verify = %v, want %v", err, tc.want)
			}
		})
	}
}

func TestVerifyAcceptsAnyOfSeveralSignatures(t *testing.T) {
	at := time.Unix(1733300000, 0)
	body := []byte("x")
	old := Sign("whsec_old", at, body)
	h := old + "," + Sign("whsec_new", at, body)[len("t=1733300000,"):]
	if err := Verify("whsec_new", h, body, at, 0); err != nil {
		t.Fatal(err)
	}
}
