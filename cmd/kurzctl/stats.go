package main

import (
	"fmt"
	"github.com/spf13/pflag"
	"io"
	"math"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	analyticsv1 "kurz.dev/gen/kurz/analytics/v1"
)

// chartWidth is the longest bar of the stats chart, in terminal cells.
const chartWidth = 40

func statsCommand() *command {
	return &command{
		name: "stats", args: "<code>", minArgs: 1, maxArgs: 1,
		summary: "a link's clicks: totals, top referrers, a chart",
		help: `Shows a link's clicks over a time range (by default the last 30 days):
totals split into human, bot and flood clicks, unique visitors, the top
referrers, browsers, devices and countries (when the redirect has a GeoIP
database), the clicks per redirect rule and per A/B-test variant (for a link
with rules), and a bar chart of the series (█ human, ░ bot and flood). The
range is widened to whole hours; hourly series cover at most 31 days.

Examples:
  kurzctl stats 1000abc
  kurzctl stats 1000abc --since 48h --interval hour
  kurzctl stats 1000abc --start 2026-01-01 --end 2026-02-01
  kurzctl stats 1000abc -o json`,
		setup: setupStats,
	}
}

// parseDay parses an RFC 3339 time or a date (midnight UTC).
func parseDay(s string) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time (2026-01-02T15:04:05Z) nor a date (2026-01-02)", s)
}

func setupStats(c *cli, fs *pflag.FlagSet) func([]string) error {
	const cmd = "stats"
	since := fs.String("since", "", "the range's `duration` up to now, e.g. 7d or 48h")
	start := fs.String("start", "", "the range's start: an RFC 3339 `time` or a date")
	end := fs.String("end", "", "the range's end (exclusive; default now): an RFC 3339 `time` or a date")
	interval := fs.String("interval", "", "the series' buckets: `hour` or day (default: hours up to two days, days beyond)")
	domain := domainFlag(fs)
	return func(args []string) error {
		q := url.Values{}
		if *domain != "" {
			q.Set("domain", *domain)
		}
		if *since != "" && (*start != "" || *end != "") {
			return usagef(cmd, "give --since, or --start and --end, not both")
		}
		if *since != "" {
			d, err := parseSpan(*since)
			if err != nil || d == 0 {
				return usagef(cmd, "--since: want a duration such as 7d or 48h, got %q", *since)
			}
			q.Set("start_time", time.Now().Add(-d).UTC().Format(time.RFC3339))
		}
		for _, p := range []struct{ flag, value, param string }{{"start", *start, "start_time"}, {"end", *end, "end_time"}} {
			if p.value == "" {
				continue
			}
			t, err := parseDay(p.value)
			if err != nil {
				return usagef(cmd, "--%s: %v", p.flag, err)
			}
			q.Set(p.param, t.UTC().Format(time.RFC3339))
		}
		switch *interval {
		case "", "hour", "day":
			if *interval != "" {
				q.Set("interval", *interval)
			}
		default:
			return usagef(cmd, "--interval %q: want hour or day", *interval)
		}
		gw, err := c.gateway(cmd, apiKeyAuth)
		if err != nil {
			return err
		}
		var resp analyticsv1.GetLinkStatsResponse
		raw, err := gw.callProto(c.ctx, "GET", "/v1/links/"+url.PathEscape(args[0])+"/stats", q, nil, &resp)
		if err != nil {
			return err
		}
		if c.json() {
			return writeRaw(c.stdout, raw)
		}
		return printStats(c.stdout, &resp)
	}
}

// printStats shows a link's statistics: totals, top lists and the chart.
func printStats(w io.Writer, s *analyticsv1.GetLinkStatsResponse) error {
	unit := "day"
	if s.GetInterval() == analyticsv1.Interval_INTERVAL_HOUR {
		unit = "hour"
	}
	name := s.GetCode()
	if s.GetDomain() != "" {
		name = s.GetDomain() + "/" + s.GetCode()
	}
	fmt.Fprintf(w, "link %s: clicks from %s to %s, by %s\n\n", name,
		formatTime(s.GetStartTime()), formatTime(s.GetEndTime()), unit)
	n := s.GetCounts()
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "total\t%d\n", n.GetTotal())
	fmt.Fprintf(tw, "human\t%d\n", n.GetHuman())
	fmt.Fprintf(tw, "unique visitors\t%d\n", n.GetUniqueVisitors())
	fmt.Fprintf(tw, "bot\t%d (%s)\n", n.GetBot(), percent(s.GetBotShare()))
	fmt.Fprintf(tw, "flood\t%d (%s)\n", n.GetFlood(), percent(s.GetFloodShare()))
	if err := tw.Flush(); err != nil {
		return err
	}
	if n.GetTotal() == 0 {
		_, err := fmt.Fprintln(w, "\nno clicks in this range")
		return err
	}
	for _, top := range []struct {
		title string
		list  []*analyticsv1.KeyCount
	}{{"REFERRER", s.GetTopReferrers()}, {"BROWSER", s.GetTopBrowsers()}, {"DEVICE", s.GetTopDevices()},
		{"COUNTRY", s.GetTopCountries()}, {"RULE", s.GetRules()}, {"VARIANT", s.GetVariants()}} {
		if len(top.list) == 0 || top.title == "COUNTRY" && !anyCountry(top.list) {
			// Without a GeoIP database every click's country is unknown.
			continue
		}
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintf(tw, "%s\tCLICKS\n", top.title)
		for _, kc := range top.list {
			key := kc.GetKey()
			switch {
			case key == "" && top.title == "REFERRER":
				key = "(none)"
			case key == "" && top.title == "COUNTRY":
				key = "(unknown)"
			}
			fmt.Fprintf(tw, "%s\t%d\n", key, kc.GetCount())
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	fmt.Fprintf(w, "\nclicks by %s  █ human  ░ bot/flood\n", unit)
	_, err := io.WriteString(w, chart(s.GetSeries(), s.GetInterval(), chartWidth))
	return err
}

// anyCountry reports whether list holds a known country.
func anyCountry(list []*analyticsv1.KeyCount) bool {
	for _, kc := range list {
		if kc.GetKey() != "" {
			return true
		}
	}
	return false
}

func percent(share float64) string {
	return strconv.FormatFloat(share*100, 'f', 1, 64) + "%"
}

// eighths are the block characters of 1/8 to 7/8 of a cell, for the
// human part of a bar.
var eighths = []string{"", "▏", "▎", "▍", "▌", "▋", "▊", "▉"}

// chart draws one bar per bucket, scaled so the busiest bucket fills width
// cells: human clicks in blocks (to an eighth of a cell), then bot and
// flood clicks shaded, then the figures. A non-zero part always shows. The
// counts are the gateway's word: a bucket whose parts exceed its total, or
// a negative count, still draws a bar of 0 to width cells (and one for a
// non-zero bot part after a full human one), never one sized by the count.
func chart(series []*analyticsv1.TimeBucket, interval analyticsv1.Interval, width int) string {
	layout := "2006-01-02"
	if interval == analyticsv1.Interval_INTERVAL_HOUR {
		layout = "01-02 15:04"
	}
	var peak int64
	for _, b := range series {
		peak = max(peak, b.GetCounts().GetTotal())
	}
	var sb strings.Builder
	for _, b := range series {
		n := b.GetCounts()
		other := n.GetBot() + n.GetFlood()
		var bar strings.Builder
		if peak > 0 {
			h8 := scaled(n.GetHuman(), peak, width*8)
			bar.WriteString(strings.Repeat("█", h8/8) + eighths[h8%8])
			o := min(scaled(other, peak, width), max(width-(h8+7)/8, 1))
			bar.WriteString(strings.Repeat("░", o))
		}
		figures := strconv.FormatInt(n.GetTotal(), 10)
		if other > 0 {
			figures += fmt.Sprintf(" (%d bot/flood)", other)
		}
		// Padded by hand: tabwriter would count the block characters'
		// bytes, not cells.
		fmt.Fprintf(&sb, "%s  %s%s  %s\n", b.GetStartTime().AsTime().UTC().Format(layout), bar.String(),
			strings.Repeat(" ", max(0, width+1-cells(bar.String()))), figures)
	}
	return sb.String()
}

// scaled is n's share of peak in units, rounded: 0 for n <= 0, else 1 to
// units (a count above peak fills units).
func scaled(n, peak int64, units int) int {
	if n <= 0 || peak <= 0 {
		return 0
	}
	f := math.Round(float64(n) * float64(units) / float64(peak))
	return int(max(1, min(f, float64(units))))
}

// cells is the width of s in terminal cells: one per rune (the block
// characters are all narrow).
func cells(s string) int { return len([]rune(s)) }
