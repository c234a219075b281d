//go:build integration

package faults

import (
	"bufio"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// metrics is one scrape of a service's Prometheus endpoint: each sample line
// (name with labels) and its value.
type metrics map[string]float64

func scrape(t *testing.T, s *service) metrics {
	t.Helper()
	resp, err := http.Get("http://" + s.opsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	m := metrics{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			m[line[:i]] = v
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return m
}

// sum adds every sample whose line starts with prefix (a metric name, or a
// name and the start of its labels).
func (m metrics) sum(prefix string) float64 {
	var total float64
	for k, v := range m {
		if k == prefix || strings.HasPrefix(k, prefix+"{") || (strings.Contains(prefix, "{") && strings.HasPrefix(k, prefix)) {
			total += v
		}
	}
	return total
}

// names lists the sample lines starting with prefix, for failure messages.
func (m metrics) names(prefix string) []string {
	var out []string
	for k, v := range m {
		if strings.HasPrefix(k, prefix) {
			out = append(out, k+" "+strconv.FormatFloat(v, 'g', -1, 64))
		}
	}
	return out
}
