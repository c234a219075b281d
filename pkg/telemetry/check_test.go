package telemetry

import (
	"strings"
	"testing"

	"kurz.dev/pkg/config"
)

// KURZ_TRACE_SAMPLE_RATIO outside 0..1 is refused by name, NaN included
// (strconv parses it, and it fails every comparison, so a range check that
// refuses only what compares outside let it through).
func TestSampleRatioOutsideZeroToOneRefused(t *testing.T) {
	check := func(ratio string) error {
		var c Config
		lookup := func(name string) (string, bool) { return ratio, name == "KURZ_TRACE_SAMPLE_RATIO" }
		if err := config.LoadFrom(lookup, &c); err != nil {
			t.Fatalf("KURZ_TRACE_SAMPLE_RATIO=%s: %v", ratio, err)
		}
		return c.Check()
	}
	for _, ratio := range []string{"NaN", "-0.1", "1.1", "+Inf", "-Inf"} {
		if err := check(ratio); err == nil || !strings.Contains(err.Error(), "KURZ_TRACE_SAMPLE_RATIO") {
			t.Errorf("KURZ_TRACE_SAMPLE_RATIO=%s: %v, want an error naming it", ratio, err)
		}
	}
	for _, ratio := range []string{"0", "0.25", "1"} {
		if err := check(ratio); err != nil {
			t.Errorf("KURZ_TRACE_SAMPLE_RATIO=%s: %v, want accepted", ratio, err)
		}
	}
}

// KURZ_OTLP_ENDPOINT without a port, or as a URL (with a token in it),
// was taken: the exporter failed at every export, the traces were lost.
func TestOTLPEndpointMustBeHostPort(t *testing.T) {
	for _, e := range []string{"127.0.0.1", "https://user:hunter2@collector:4317", "collector:"} {
		err := Config{OTLPEndpoint: e}.Check()
		if err == nil || !strings.Contains(err.Error(), "KURZ_OTLP_ENDPOINT") || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("KURZ_OTLP_ENDPOINT=%s: %v, want an error naming it, without credentials", e, err)
		}
	}
	for _, e := range []string{"", "otel-collector:4317", "[::1]:4317"} {
		if err := (Config{OTLPEndpoint: e}).Check(); err != nil {
			t.Errorf("KURZ_OTLP_ENDPOINT=%s: %v, want accepted", e, err)
		}
	}
}
