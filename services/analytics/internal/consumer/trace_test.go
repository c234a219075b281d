//go:build integration

package consumer

import (
	"fmt"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"kurz.dev/pkg/clickevent"
)

// The batch that stores a click links back to the redirect span that
// produced it, through the traceparent the event carries.
func TestFlushSpanLinksToTheRedirectSpans(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rec := tracetest.NewSpanRecorder()
	opts := e.opts()
	opts.TracerProvider = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	code := "trc" + rnd()
	want := map[trace.SpanID]trace.TraceID{}
	var events []clickevent.Event
	for i := range 5 {
		ev := e.click(code, time.Duration(i)*time.Second, visitor(i), "Mozilla/5.0", "")
		var tid [16]byte
		var sid [8]byte
		copy(tid[:], fmt.Sprintf("trace-%010d", i))
		copy(sid[:], fmt.Sprintf("sp-%05d", i))
		ev.TraceParent = fmt.Sprintf("00-%x-%x-01", tid, sid)
		want[trace.SpanID(sid)] = trace.TraceID(tid)
		events = append(events, ev)
	}
	e.start(opts, e.rdb, e.store, allowAll(t))
	e.xadd(events...)
	eventually(t, 20*time.Second, "every click linked from a flush span", func() (bool, string) {
		got := 0
		for _, s := range rec.Ended() {
			if s.Name() != "clicks.flush" || s.SpanKind() != trace.SpanKindConsumer {
				continue
			}
			for _, l := range s.Links() {
				if tid, ok := want[l.SpanContext.SpanID()]; ok && tid == l.SpanContext.TraceID() {
					got++
				}
			}
		}
		return got == len(want), fmt.Sprintf("%d of %d redirect spans linked", got, len(want))
	})
}
