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
