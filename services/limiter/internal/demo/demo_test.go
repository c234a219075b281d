//go:build integration

package demo

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/config"
	"kurz.dev/pkg/redisconn"
	"kurz.dev/pkg/testkit/servertest"
	"kurz.dev/services/limiter/internal/app"
	"kurz.dev/services/limiter/internal/ratelimit"
	"kurz.dev/services/limiter/internal/rulestore"
)

// The demo's figures are the notes' figures: the race through a real limiter
// service (bootstrap rules from the file), the trace through the engine.
func TestDemoReproducesTheNotes(t *testing.T) {
	var cfg app.Config
	if err := config.LoadFrom(servertest.Env(map[string]string{
		"KURZ_LIMITER_GRPC_ADDR": "127.0.0.1:0", "KURZ_LIMITER_HTTP_ADDR": "127.0.0.1:0",
		"KURZ_LIMITER_RULES_SOURCE": "file", "KURZ_LIMITER_REDIS_TIMEOUT": "2s",
		"KURZ_REDIS_READ_TIMEOUT": "5s", "KURZ_REDIS_WRITE_TIMEOUT": "5s",
	}), &cfg); err != nil {
		t.Fatal(err)
	}
	srv, err := app.New(context.Background(), cfg, servertest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	r := servertest.Start(t, srv)
	r.AwaitServing(t, "")

	var rc redisconn.Config
	if err := config.Load(&rc); err != nil {
		t.Fatal(err)
	}
	rc.ReadTimeout, rc.WriteTimeout = 5*time.Second, 5*time.Second
	rdb, err := redisconn.New(context.Background(), rc)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	user := "demo-test-" + strconv.FormatInt(time.Now().UnixNano(), 36)

	race, err := Race(context.Background(), rdb, ratelimitv1.NewRateLimitServiceClient(r.Conn), user, "")
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	PrintRace(&out, race)
	if bad := Check(race); len(bad) > 0 {
		t.Errorf("race differs from the notes:\n%s\n%s", strings.Join(bad, "\n"), out.String())
	}

	rules, err := rulestore.Parse(rulestore.Bootstrap)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := ratelimit.Compile(rules)
	if err != nil {
		t.Fatal(err)
	}
	e, err := ratelimit.NewEngine(rdb, rs, ratelimit.Options{Timeout: 5 * time.Second}, servertest.Logger(t), noop.NewMeterProvider())
	if err != nil {
		t.Fatal(err)
	}
	rows := Trace(context.Background(), e, user)
	out.Reset()
	PrintTrace(&out, rows)
	if bad := CheckTrace(rows); len(bad) > 0 || len(rows) != 5 {
		t.Errorf("trace differs from the notes:\n%s\n%s", strings.Join(bad, "\n"), out.String())
	}
}

func TestCheckTranscriptCatchesDrift(t *testing.T) {
	good := TranscriptResult{
		Codes:   []string{"ogssVj8", "uORadt4", "7aQeJ84"}, // permuted, then random
		Invalid: `{"error":"invalid url"}`,
		Known:   [2]string{"302 db", "302 cache"},
		Unknown: [2]string{"404 db", "404 cache"},
	}
	if bad := CheckTranscript(good); len(bad) != 0 {
		t.Errorf("the notes' own transcript: %v", bad)
	}
	drifted := good
	drifted.Codes = []string{"10000g8", "10000g9", "10000ga"}
	drifted.Known = [2]string{"302 db", "302 db"}
	if bad := CheckTranscript(drifted); len(bad) != 3 {
		t.Errorf("drifted transcript: got %d problems %v, want 3 (walkable defaults, random follows, no cache)", len(bad), bad)
	}
}
