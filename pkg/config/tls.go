package config

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// ClientTLS is the TLS configuration of a client of a store (Redis,
// ClickHouse) from its settings <variable> (on) and <variable>_CA_FILE
// (caFile): nil when off; else TLS 1.2 or later, the server's certificate
// verified against caFile's PEM certificates, or the system's roots when
// caFile is empty (the server name is the one dialled: crypto/tls fills it
// from the address). A CA file without TLS on is refused: whoever names a
// CA expects TLS, never the password in clear instead. Errors name the
// variables.
func ClientTLS(variable string, on bool, caFile string) (*tls.Config, error) {
	caVariable := Prefix + variable + "_CA_FILE"
	if !on {
		if caFile != "" {
			return nil, fmt.Errorf("%s is set without %s=true", caVariable, Prefix+variable)
		}
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile == "" {
		return c, nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("%s=%s: %w", caVariable, caFile, err)
	}
	c.RootCAs = x509.NewCertPool()
	if !c.RootCAs.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s=%s: no PEM certificate in it", caVariable, caFile)
	}
	return c, nil
}
