package stats

import (
	"testing"
	"time"
)

// A refused range's span never reads as the bound it passed.
func TestSpan(t *testing.T) {
	for d, want := range map[time.Duration]string{
		31*24*time.Hour + time.Second:  "31 days 1 hour",
		31*24*time.Hour + time.Hour:    "31 days 1 hour",
		24*time.Hour + 5*time.Hour:     "1 day 5 hours",
		11 * 24 * time.Hour:            "11 days",
		401*24*time.Hour - time.Minute: "401 days",
	} {
		if got := span(d); got != want {
			t.Errorf("span(%v) = %q, want %q", d, got, want)
		}
	}
}
