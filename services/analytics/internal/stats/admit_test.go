package stats

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	analyticsv1 "kurz.dev/gen/kurz/analytics/v1"
	"kurz.dev/pkg/callmeta"
	"kurz.dev/pkg/rpcerr"
	"kurz.dev/services/analytics/internal/clickstore"
)

// heldStore is a store whose reads wait until open is closed (or their
// context ends), and that tells entered of every request it serves.
type heldStore struct {
	open    chan struct{}
	entered chan string // a request's code, from its Owners read
}

func (h *heldStore) wait(ctx context.Context) error {
	select {
	case <-h.open:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (h *heldStore) Owners(ctx context.Context, code string) ([]string, error) {
	h.entered <- code
	return nil, h.wait(ctx)
}

func (h *heldStore) Hourly(ctx context.Context, _ clickstore.Range) (map[int64]clickstore.Counts, error) {
	return map[int64]clickstore.Counts{}, h.wait(ctx)
}

func (h *heldStore) Dims(ctx context.Context, _ clickstore.Range, _ map[string]int) (map[string]map[string]int64, error) {
	return map[string]map[string]int64{}, h.wait(ctx)
}

func (h *heldStore) Duplicates(ctx context.Context, _ clickstore.Range) ([]clickstore.Duplicate, error) {
	return nil, h.wait(ctx)
}

func (h *heldStore) LinkCounts(ctx context.Context, _ string, codes []string, _, _ time.Time) (map[string]clickstore.Counts, error) {
	h.entered <- codes[0]
	return nil, h.wait(ctx)
}

// refusedWithin bounds a call the bound must refuse: without it the call
// would wait in the store, and fail DEADLINE_EXCEEDED here instead.
const refusedWithin = 5 * time.Second

func call(ctx context.Context, s *Service, tenant string) error {
	_, err := s.GetLinkStats(callmeta.WithVerifiedTenant(ctx, tenant), &analyticsv1.GetLinkStatsRequest{Code: "abc1234"})
	return err
}

func assertRefused(t *testing.T, err error, code codes.Code, reason string) {
	t.Helper()
	info, _, retry := rpcerr.Details(err)
	if status.Code(err) != code || info.GetReason() != reason || retry.GetRetryDelay().AsDuration() <= 0 {
		t.Fatalf("call = %v (reason %q, retry %v), want %s %s with a retry delay", err, info.GetReason(), retry.GetRetryDelay(), code, reason)
	}
}

// refusals reads MetricRefused's counts by reason.
func refusals(t *testing.T, reader *sdkmetric.ManualReader) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == MetricRefused {
				for _, dp := range sum.DataPoints {
					reason, _ := dp.Attributes.Value("reason")
					got[reason.AsString()] += dp.Value
				}
			}
		}
	}
	return got
}

// One tenant holds at most its share of the requests in progress, and past
// MaxRequests every request is refused as busy at once, with a retry delay,
// without reaching the store, each refusal counted by its reason; once the
// requests end, their slots are free.
func TestStatsRequestsInProgressAreBoundedPerReplicaAndPerTenant(t *testing.T) {
	store := &heldStore{open: make(chan struct{}), entered: make(chan string, 64)}
	reader := sdkmetric.NewManualReader()
	meter := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)).Meter("test")
	s := New(store, slog.New(slog.NewTextHandler(io.Discard, nil)), Options{MaxRequests: 4, QueryTimeout: time.Minute, Meter: meter})
	var held sync.WaitGroup
	errs := make(chan error, 4)
	hold := func(tenant string) {
		held.Go(func() { errs <- call(context.Background(), s, tenant) })
		<-store.entered
	}
	hold("a")
	hold("a")

	ctx, cancel := context.WithTimeout(context.Background(), refusedWithin)
	defer cancel()
	assertRefused(t, call(ctx, s, "a"), codes.ResourceExhausted, ReasonShareInUse)

	hold("b")
	hold("b")
	assertRefused(t, call(ctx, s, "c"), codes.Unavailable, ReasonBusy)
	if got := refusals(t, reader); got[ReasonShareInUse] != 1 || got[ReasonBusy] != 1 || len(got) != 2 {
		t.Errorf("refusals counted %v, want 1 %s and 1 %s", got, ReasonShareInUse, ReasonBusy)
	}
	select {
	case code := <-store.entered:
		t.Fatalf("a refused request reached the store (%s)", code)
	default:
	}

	close(store.open)
	held.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("admitted request: %v", err)
		}
	}
	if err := call(ctx, s, "c"); err != nil {
		t.Fatalf("request after the others ended: %v", err)
	}
	if len(s.held) != 0 {
		t.Errorf("requests still counted in progress after all ended: %v", s.held)
	}
}
