package config

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// ClientTLS is the TLS configuration of a client of a store (Redis,
// ClickHouse): TLS 1.2 or later, the server's certificate verified
// against caFile's PEM certificates, or the system's roots when caFile is
// empty. The server name is the one dialled (crypto/tls fills it from the
// address). variable names caFile's setting in the error.
func ClientTLS(variable, caFile string) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile == "" {
		return c, nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("%s=%s: %w", Prefix+variable, caFile, err)
	}
	c.RootCAs = x509.NewCertPool()
	if !c.RootCAs.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s=%s: no PEM certificate in it", Prefix+variable, caFile)
	}
	return c, nil
}
