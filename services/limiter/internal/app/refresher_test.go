package app

import (
	"errors"
	"testing"

	"kurz.dev/pkg/testkit/metrictest"
)

// A reload counts under its outcome and its rules' source, so the alerts
// can tell a refused rules file (paged: it stays refused until edited)
// from a PostgreSQL row that does not compile (warned).
func TestRuleReloadsCountBySource(t *testing.T) {
	for _, source := range []string{"file", "postgres"} {
		r, meter := metrictest.New()
		refresher, err := newRefresher(Config{RulesSource: source}, nil, nil, meter, nil)
		if err != nil {
			t.Fatal(err)
		}
		refresher.OnResult(nil)
		refresher.OnResult(errors.New("refused"))
		refresher.OnResult(errors.New("refused again"))
		const name = "kurz.ratelimit.rules.refreshes"
		if got := metrictest.Counter(t, r, name, "source", source); got != 3 {
			t.Errorf("source %s: %d reloads counted under source=%s, want 3", source, got, source)
		}
		if got := metrictest.Counter(t, r, name, "ok", "false"); got != 2 {
			t.Errorf("source %s: %d reloads counted as failed, want 2", source, got)
		}
	}
}
