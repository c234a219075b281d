package webhook

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// One subscription whose walk fails (a backlog too large to walk within
// the query timeout) does not stop the trim of the subscriptions after it:
// its page is walked again one subscription at a time, the failing one
// skipped, and its error returned after the pass.
func TestTrimGoesOnPastASubscriptionThatCannotBeWalked(t *testing.T) {
	subs := []string{"a", "b", "c", "d", "e"}
	after := func(id string) []string {
		i, _ := slices.BinarySearch(subs, id)
		if i < len(subs) && subs[i] == id {
			i++
		}
		return subs[i:]
	}
	page := func(from string, n int) []string {
		rest := after(from)
		return rest[:min(n, len(rest))]
	}
	walk := func(from string, n int) ([]trimEdge, string, error) {
		p := page(from, n)
		if slices.Contains(p, "b") {
			return nil, "", errors.New("canceling statement due to statement timeout")
		}
		var edges []trimEdge
		for _, id := range p {
			edges = append(edges, trimEdge{subID: id})
		}
		last := ""
		if len(p) == n {
			last = p[len(p)-1]
		}
		return edges, last, nil
	}
	ids := func(from string, n int) ([]string, error) { return page(from, n), nil }
	var trimmed []string
	trim := func(e trimEdge) (int64, error) {
		trimmed = append(trimmed, e.subID)
		return 1, nil
	}
	n, err := trimPages(2, walk, ids, trim)
	if want := []string{"a", "c", "d", "e"}; !slices.Equal(trimmed, want) || n != 4 {
		t.Errorf("trimmed %v (%d deleted), want %v: every subscription but the one that cannot be walked", trimmed, n, want)
	}
	if err == nil || !strings.Contains(err.Error(), "subscription b") {
		t.Errorf("error %v, want one naming subscription b", err)
	}
}
