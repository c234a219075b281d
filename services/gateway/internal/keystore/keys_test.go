package keystore

import (
	"strings"
	"testing"
)

func TestParseKeyID(t *testing.T) {
	id := "AbCdEf012345"
	secret := strings.Repeat("x", keySecretLen)
	for key, want := range map[string]string{
		KeyPrefix + id + "_" + secret:           id,
		KeyPrefix + id + "-" + secret:           "",
		KeyPrefix + id + "_" + secret + "x":     "",
		"KURZ_" + id + "_" + secret:             "",
		KeyPrefix + "AbCdEf01234!_" + secret:    "",
		KeyPrefix + id + "_" + secret[1:] + "é": "",
	} {
		got, ok := ParseKeyID(key)
		if got != want || ok != (want != "") {
			t.Errorf("ParseKeyID(%q) = %q %v, want %q", key, got, ok, want)
		}
	}
}

func TestTenantIDProblem(t *testing.T) {
	for id, ok := range map[string]bool{
		"acme": true, "a": true, "acme-2": true, strings.Repeat("a", 63): true,
		"": false, "Acme": false, "-acme": false, "acme-": false, "ac_me": false, strings.Repeat("a", 64): false, "anonymous": false,
	} {
		if got := TenantIDProblem(id) == ""; got != ok {
			t.Errorf("TenantIDProblem(%q) ok = %v, want %v", id, got, ok)
		}
	}
}

func TestReasonProblem(t *testing.T) {
	for reason, ok := range map[string]bool{
		"phishing campaign, ticket ABUSE-12": true, strings.Repeat("é", MaxReasonLen/2): true,
		"": false, "   ": false, strings.Repeat("a", MaxReasonLen+1): false, "line\nbreak": false, "nul\x00": false, "\xff": false,
	} {
		if got := ReasonProblem(reason) == ""; got != ok {
			t.Errorf("ReasonProblem(%q) ok = %v, want %v", reason, got, ok)
		}
	}
}
