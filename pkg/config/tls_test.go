package config

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// ClientTLS is nil when off, trusts the system's roots without a CA file,
// and refuses by name a CA file without TLS, or one that cannot be read or
// holds no PEM certificate.
func TestClientTLS(t *testing.T) {
	if c, err := ClientTLS("X_TLS", false, ""); c != nil || err != nil {
		t.Errorf("off: %+v, %v; want nil", c, err)
	}
	c, err := ClientTLS("X_TLS", true, "")
	if err != nil || c.RootCAs != nil || c.MinVersion != tls.VersionTLS12 {
		t.Errorf("no CA file: %+v, %v; want the system's roots, TLS 1.2 or later", c, err)
	}
	junk := filepath.Join(t.TempDir(), "junk.pem")
	if err := os.WriteFile(junk, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{junk, filepath.Join(t.TempDir(), "missing.pem")} {
		if _, err := ClientTLS("X_TLS", true, f); err == nil || !strings.Contains(err.Error(), "KURZ_X_TLS_CA_FILE="+f) {
			t.Errorf("CA file %s: %v, want an error naming KURZ_X_TLS_CA_FILE", f, err)
		}
	}
	if _, err := ClientTLS("X_TLS", false, junk); err == nil || !strings.Contains(err.Error(), "KURZ_X_TLS_CA_FILE is set without KURZ_X_TLS=true") {
		t.Errorf("a CA file without TLS: %v, want it refused by name", err)
	}
}
