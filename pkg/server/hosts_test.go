package server

import (
	"strings"
	"testing"
)

// The Host check answers IP literals, localhost, Kubernetes Service names
// and the listed names, with or without a port, in any case; it refuses
// every other name, the kind a web page rebinds to a forwarded port.
func TestOpsHostsAllow(t *testing.T) {
	h := newOpsHosts([]string{"metrics.example.internal", ".svc.corp.internal"})
	for host, want := range map[string]bool{
		"":                            true, // HTTP/1.0, no Host: no browser
		"127.0.0.1:9191":              true,
		"10.42.0.17:9191":             true, // Prometheus, the kubelet: a pod IP
		"127.0.0.1.:9191":             true,
		"[::1]:9194":                  true,
		"[fd00::17]":                  true,
		"localhost:9191":              true, // kubectl port-forward
		"LOCALHOST:9191":              true,
		"kurz.localhost:9191":         true, // RFC 6761: the browser's own loopback
		"limiter-envoy:9191":          true, // a Service of the caller's namespace
		"limiter-envoy.kurz.svc:9191": true,
		"limiter-envoy.kurz.svc.cluster.local:9191": true,
		"limiter-envoy.kurz.svc.cluster.local.":     true,
		"10-42-0-17.kurz.pod.cluster.local":         true,
		"metrics.example.internal:9191":             true, // listed
		"limiter.kurz.svc.corp.internal":            true, // under a listed suffix

		"attacker.example:9191":                false, // rebound to 127.0.0.1
		"attacker.example.:9191":               false,
		"127.0.0.1.attacker.example":           false,
		"svc.attacker.example":                 false,
		"limiter.svc.attacker.example":         false,
		"cluster.local.attacker.example":       false,
		"localhost.attacker.example":           false,
		"example.internal":                     false, // the listed name's parent
		"other.example.internal":               false, // listed exactly, not as a suffix
		"corp.internal":                        false,
		"limiter-envoy.kurz:9191":              false, // <service>.<namespace> looks like a public name
		"[not-an-ip]:9191":                     false,
		":9191":                                false,
		strings.Repeat("a.", 200) + "svc":      false, // over a name's length
		"xn--80ak6aa92e.example":               false,
		"metrics.example.internal.attacker.io": false,
	} {
		if got := h.allow(host); got != want {
			t.Errorf("allow(%q) = %v, want %v", host, got, want)
		}
	}
}

// Without KURZ_OPS_ALLOWED_HOSTS only the built-in names pass.
func TestOpsHostsWithoutAllowedHosts(t *testing.T) {
	h := newOpsHosts(nil)
	if h.allow("metrics.example.internal") {
		t.Error("metrics.example.internal allowed with no allowed hosts")
	}
	if !h.allow("127.0.0.1:9191") || !h.allow("limiter.kurz.svc") {
		t.Error("an IP or a Service name refused with no allowed hosts")
	}
}

func TestCheckAllowedHosts(t *testing.T) {
	if err := CheckAllowedHosts("KURZ_OPS_ALLOWED_HOSTS", []string{"metrics.example.internal", ".svc.corp.internal", "ops_host", "prometheus"}); err != nil {
		t.Errorf("valid entries refused: %v", err)
	}
	for _, bad := range []string{"", ".", "Metrics.example.internal", "metrics.example.internal:9191", "*.example.internal",
		"a..b", "example.internal.", "http://metrics", "[::1]", strings.Repeat("a", 64) + ".internal"} {
		err := CheckAllowedHosts("KURZ_OPS_ALLOWED_HOSTS", []string{"prometheus", bad})
		if err == nil || !strings.Contains(err.Error(), "KURZ_OPS_ALLOWED_HOSTS") || !strings.Contains(err.Error(), `"`+bad+`"`) {
			t.Errorf("entry %q: got %v, want an error naming KURZ_OPS_ALLOWED_HOSTS and the entry", bad, err)
		}
	}
}
