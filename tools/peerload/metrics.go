package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// decisionsMetric counts the limiter's decisions by domain, rule, outcome
// and source (how it was decided: redis, local_fallback, fail_open, ...).
const decisionsMetric = "kurz_ratelimit_decisions_total"

// decisionsBySource scrapes the limiter's /metrics at url and returns its
// decisions of rule in domain so far, by source.
func decisionsBySource(ctx context.Context, url, domain, rule string) (map[string]int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("limiter metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("limiter metrics: %s", resp.Status)
	}
	return parseDecisions(resp.Body, domain, rule)
}

// parseDecisions reads Prometheus text exposition and sums decisionsMetric
// of domain and rule by source.
func parseDecisions(r io.Reader, domain, rule string) (map[string]int64, error) {
	out := map[string]int64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), decisionsMetric+"{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(line, "} ")
		if !ok {
			return nil, fmt.Errorf("limiter metrics: malformed line %q", sc.Text())
		}
		l := parseLabels(labels)
		if l["domain"] != domain || l["rule"] != rule {
			continue
		}
		v, err := strconv.ParseFloat(strings.Fields(value)[0], 64)
		if err != nil {
			return nil, fmt.Errorf("limiter metrics: value of %q: %w", sc.Text(), err)
		}
		out[l["source"]] += int64(v)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("limiter metrics: %w", err)
	}
	return out, nil
}

// parseLabels splits `a="x",b="y"`. Values with quotes or commas escaped
// inside do not occur in the labels read here; they would only mislabel
// that one series.
func parseLabels(s string) map[string]string {
	out := map[string]string{}
	for kv := range strings.SplitSeq(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if ok {
			out[k] = strings.Trim(v, `"`)
		}
	}
	return out
}
