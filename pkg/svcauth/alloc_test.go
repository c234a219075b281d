package svcauth_test

import (
	"testing"

	"kurz.dev/pkg/svcauth"
	"kurz.dev/pkg/testkit/servertest"
)

// Verification runs on every call to the shortener and analytics: it
// allocates only the tenant string it returns.
func TestVerifyAllocatesOnlyTheTenant(t *testing.T) {
	if servertest.RaceEnabled {
		t.Skip("the race detector makes sync.Pool drop items at random: allocations are counted without it")
	}
	k := svcauth.NewKeys([]byte("0123456789abcdef0123456789abcdef-key-a"), nil)
	const method = "/kurz.shortener.v1.ShortenerService/GetLink"
	a := k.Sign("acme", method)
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := k.Verify(a, method); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 1 {
		t.Errorf("Verify allocates %.0f times per call, want at most 1 (the tenant)", allocs)
	}
}
