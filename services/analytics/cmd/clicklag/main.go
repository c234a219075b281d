// Command clicklag measures the end-to-end lag of the click pipeline on a
// running stack: from a redirect to the statistics that count it. It creates
// a link (shortener gRPC), then n times, one after the other: GETs the short
// link on the redirect service (without following the redirect) and polls
// GetLinkStats (analytics gRPC) every -poll until the link's total includes
// the click. A sample is the time from the redirect's response to the first
// answer that counts it.
//
//	go run ./services/analytics/cmd/clicklag -n 20
//
// Batching on the way bounds the lag: the redirect's click writer lingers up
// to KURZ_REDIRECT_CLICK_FLUSH_INTERVAL (100ms), and the consumer flushes a
// batch at most KURZ_ANALYTICS_BATCH_AGE (1s) after its first click (sooner
// when it fills up), so on a quiet stack a click waits up to about a second
// before the flush stores it. A click that does not show up within -timeout
// is an error (exit status 1).
//
// It calls the shortener and analytics as the gateway does, signing each
// call with KURZ_SERVICE_AUTH_KEY (make up's key on a local stack).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/timestamppb"

	analyticsv1 "kurz.dev/gen/kurz/analytics/v1"
	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/callmeta"
	"kurz.dev/pkg/config"
	"kurz.dev/services/analytics/internal/app"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "clicklag:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	shortenerAddr := flag.String("shortener", "127.0.0.1:9092", "shortener gRPC address (creates the link)")
	redirectAddr := flag.String("redirect", "127.0.0.1:8787", "redirect service HTTP address")
	analyticsAddr := flag.String("analytics", "127.0.0.1:9093", "analytics gRPC address (GetLinkStats)")
	tenant := flag.String("tenant", "clicklag", `tenant of the link and the statistics (x-kurz-tenant); "" = anonymous`)
	n := flag.Int("n", 20, "clicks to measure, one after the other")
	poll := flag.Duration("poll", 10*time.Millisecond, "GetLinkStats polling interval")
	timeout := flag.Duration("timeout", 30*time.Second, "longest wait for one click to be counted")
	flag.Parse()
	if *n < 1 || *poll <= 0 || *timeout <= 0 {
		return errors.New("-n, -poll and -timeout must be positive")
	}
	// The consumer's batch age as the analytics service reads it from this
	// environment: its default unless KURZ_ANALYTICS_BATCH_AGE is set here;
	// and the key the services verify calls with.
	var cfg app.Config
	if err := config.Load(&cfg); err != nil {
		return err
	}
	keys, err := cfg.ServiceAuth.Keys()
	if err != nil {
		return fmt.Errorf("%w\n(make up keeps the stack's key in .local/service-auth.key: KURZ_SERVICE_AUTH_KEY=$(cat .local/service-auth.key))", err)
	}

	ctx = callmeta.Outgoing(ctx, *tenant, "")
	shortenerConn, err := grpc.NewClient(*shortenerAddr, grpc.WithTransportCredentials(insecure.NewCredentials()), keys.DialOption())
	if err != nil {
		return err
	}
	defer shortenerConn.Close()
	analyticsConn, err := grpc.NewClient(*analyticsAddr, grpc.WithTransportCredentials(insecure.NewCredentials()), keys.DialOption())
	if err != nil {
		return err
	}
	defer analyticsConn.Close()
	stats := analyticsv1.NewAnalyticsServiceClient(analyticsConn)

	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	created, err := shortenerv1.NewShortenerServiceClient(shortenerConn).CreateLink(cctx, &shortenerv1.CreateLinkRequest{
		LongUrl: fmt.Sprintf("https://example.com/clicklag/%d", time.Now().UnixNano()),
	})
	cancel()
	if err != nil {
		return fmt.Errorf("create link on %s: %w", *shortenerAddr, err)
	}
	code := created.GetLink().GetCode()
	url := "http://" + *redirectAddr + "/" + code
	// Clicks land in the hour of the redirect; an hour of margin either side
	// keeps them in range whatever the clocks say.
	since := timestamppb.New(time.Now().Add(-time.Hour))
	total := func(ctx context.Context) (int64, error) {
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		resp, err := stats.GetLinkStats(qctx, &analyticsv1.GetLinkStatsRequest{
			Code: code, StartTime: since, EndTime: timestamppb.New(time.Now().Add(time.Hour)),
		})
		if err != nil {
			return 0, fmt.Errorf("GetLinkStats %s on %s: %w", code, *analyticsAddr, err)
		}
		return resp.GetCounts().GetTotal(), nil
	}
	counted, err := total(ctx)
	if err != nil {
		return err
	}

	client := &http.Client{
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Timeout:       5 * time.Second,
	}
	lags := make([]time.Duration, 0, *n)
	for i := range *n {
		clicked, err := click(ctx, client, url)
		if err != nil {
			return fmt.Errorf("click %d: %w", i+1, err)
		}
		want := counted + 1
		deadline := clicked.Add(*timeout)
		for {
			got, err := total(ctx)
			if err != nil {
				return err
			}
			if got >= want {
				lags = append(lags, time.Since(clicked))
				counted = got
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("click %d of %d on %s not counted within %s (GetLinkStats total %d, want %d): is the analytics consumer running?",
					i+1, *n, url, *timeout, got, want)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(*poll):
			}
		}
	}

	slices.Sort(lags)
	q := func(p float64) time.Duration { return lags[int(p*float64(len(lags)-1))] }
	ms := func(d time.Duration) string { return fmt.Sprintf("%.0fms", float64(d)/float64(time.Millisecond)) }
	fmt.Printf("redirect -> queryable stats lag  n=%d  p50 %s  p99 %s  max %s\n", len(lags), ms(q(0.5)), ms(q(0.99)), ms(lags[len(lags)-1]))
	fmt.Printf("note: the consumer flushes a batch at most its batch age after the batch's first click: KURZ_ANALYTICS_BATCH_AGE=%s (analytics default %s), plus the redirect's click linger (KURZ_REDIRECT_CLICK_FLUSH_INTERVAL, 100ms default), the flush and the query\n",
		cfg.BatchAge, defaultBatchAge())
	return nil
}

// click GETs url without following the redirect and returns when the
// response arrived.
func click(ctx context.Context, client *http.Client, url string) (time.Time, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return time.Time{}, err
	}
	req.Header.Set("User-Agent", "kurz-clicklag/1")
	resp, err := client.Do(req)
	if err != nil {
		return time.Time{}, err
	}
	resp.Body.Close()
	at := time.Now()
	if resp.StatusCode < 300 || resp.StatusCode > 399 {
		return at, fmt.Errorf("GET %s: status %d, want a redirect", url, resp.StatusCode)
	}
	return at, nil
}

// defaultBatchAge is the batch age the analytics service takes when
// KURZ_ANALYTICS_BATCH_AGE is not set.
func defaultBatchAge() time.Duration {
	var cfg app.Config
	if err := config.LoadFrom(func(string) (string, bool) { return "", false }, &cfg); err != nil {
		return 0
	}
	return cfg.BatchAge
}
