package svcauth

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
)

const (
	method = "/kurz.shortener.v1.ShortenerService/GetLink"
	keyA   = "0123456789abcdef0123456789abcdef-key-a"
	keyB   = "0123456789abcdef0123456789abcdef-key-b"
)

// at returns Keys whose clock reads *now.
func at(now *time.Time, current, previous string) *Keys {
	k := NewKeys([]byte(current), []byte(previous))
	k.now = func() time.Time { return *now }
	return k
}

func TestVerifyReturnsTheSignedTenant(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	k := at(&now, keyA, "")
	for _, tenant := range []string{"acme", "", "tnt_01HZ.with.dots", strings.Repeat("t", MaxTenantLen)} {
		got, err := k.Verify(k.Sign(tenant, method), method)
		if err != nil || got != tenant {
			t.Errorf("Verify(Sign(%q)) = %q, %v; want %q, nil", tenant, got, err, tenant)
		}
	}
}

func TestVerifyRefuses(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	k := at(&now, keyA, "")
	good := k.Sign("acme", method)
	other := at(&now, keyB, "").Sign("acme", method)
	exp := strconv.FormatInt(now.Add(TTL).Unix(), 10)
	longer := strings.Replace(good, "."+exp+".", "."+strconv.FormatInt(now.Add(TTL).Unix()+1, 10)+".", 1)
	forgedTenant := strings.Replace(good, ".YWNtZQ.", ".dmljdGlt.", 1) // acme -> victim, MAC kept
	if forgedTenant == good || longer == good {
		t.Fatalf("test setup: %q does not hold acme as YWNtZQ and expiry %s", good, exp)
	}
	for name, c := range map[string]struct {
		assertion, audience string
		want                error
	}{
		"none":           {"", method, ErrMissing},
		"garbage":        {"not-an-assertion", method, ErrMalformed},
		"too long":       {good + strings.Repeat("A", MaxAssertionLen), method, ErrMalformed},
		"wrong key":      {other, method, ErrSignature},
		"another method": {good, "/kurz.shortener.v1.ShortenerService/DeleteLink", ErrSignature},
		"tenant changed": {forgedTenant, method, ErrSignature},
		"truncated MAC":  {good[:len(good)-1], method, ErrMalformed},
		"expiry changed": {longer, method, ErrSignature},
	} {
		got, err := k.Verify(c.assertion, c.audience)
		if !errors.Is(err, c.want) || got != "" {
			t.Errorf("%s: Verify = %q, %v; want \"\", %v", name, got, err, c.want)
		}
	}
}

func TestVerifyBoundsTheLifetime(t *testing.T) {
	signedAt := time.Unix(1_800_000_000, 0)
	now := signedAt
	k := at(&now, keyA, "")
	a := k.Sign("acme", method)
	for _, c := range []struct {
		after time.Duration
		want  error
	}{
		{0, nil},
		{-MaxSkew, nil},      // the server's clock is behind the caller's
		{TTL + MaxSkew, nil}, // ... or ahead
		{TTL + MaxSkew + time.Second, ErrExpired},
		{-TTL, ErrTooLong}, // expiry further ahead than TTL + skew
	} {
		now = signedAt.Add(c.after)
		if _, err := k.Verify(a, method); !errors.Is(err, c.want) {
			t.Errorf("verified %s after signing: err %v, want %v", c.after, err, c.want)
		}
	}
}

func TestRotationAcceptsThePreviousKey(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	oldSigner := at(&now, keyA, "")
	rotated := at(&now, keyB, keyA)
	if got, err := rotated.Verify(oldSigner.Sign("acme", method), method); err != nil || got != "acme" {
		t.Errorf("old key's assertion during rotation: %q, %v; want acme, nil", got, err)
	}
	if got, err := rotated.Verify(rotated.Sign("acme", method), method); err != nil || got != "acme" {
		t.Errorf("new key's assertion: %q, %v; want acme, nil", got, err)
	}
	done := at(&now, keyB, "")
	if _, err := done.Verify(oldSigner.Sign("acme", method), method); !errors.Is(err, ErrSignature) {
		t.Errorf("old key's assertion after rotation: %v, want %v", err, ErrSignature)
	}
}

func TestConfigRefusesMissingAndShortKeys(t *testing.T) {
	for name, c := range map[string]struct {
		cfg  Config
		want string
	}{
		"missing":        {Config{}, "KURZ_SERVICE_AUTH_KEY is not set"},
		"short":          {Config{Key: "short"}, "KURZ_SERVICE_AUTH_KEY has 5 characters"},
		"short previous": {Config{Key: keyA, PreviousKey: "short"}, "KURZ_SERVICE_AUTH_PREVIOUS_KEY has 5 characters"},
	} {
		if _, err := c.cfg.Keys(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Keys() error %v, want one containing %q", name, err, c.want)
		}
	}
	if _, err := (Config{Key: keyA, PreviousKey: keyB}).Keys(); err != nil {
		t.Errorf("valid keys: %v", err)
	}
}

// A key this repository publishes (the dev overlay's) signs nothing anyone
// could not sign: refused unless KURZ_ALLOW_PUBLISHED_SECRETS says this is
// a local setup.
func TestConfigRefusesPublishedKeysUnlessAllowed(t *testing.T) {
	const published = "dev-only-service-auth-key-0123456789abcdef"
	for name, c := range map[string]struct {
		cfg  Config
		want string
	}{
		"key":          {Config{Key: published}, "KURZ_SERVICE_AUTH_KEY holds a value published"},
		"previous key": {Config{Key: keyA, PreviousKey: published}, "KURZ_SERVICE_AUTH_PREVIOUS_KEY holds a value published"},
	} {
		if _, err := c.cfg.Keys(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Keys() error %v, want one containing %q", name, err, c.want)
		}
		c.cfg.AllowPublishedSecrets = true
		if _, err := c.cfg.Keys(); err != nil {
			t.Errorf("%s, allowed: Keys() error %v, want nil", name, err)
		}
	}
}
