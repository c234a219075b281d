package server_test

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"kurz.dev/pkg/server"
	"kurz.dev/pkg/testkit/servertest"
)

// h2conn is a raw HTTP/2 client connection to a gRPC listener: what an
// attacker speaks, with none of a client library's manners.
type h2conn struct {
	t  *testing.T
	c  net.Conn
	fr *http2.Framer
}

func dialH2(t *testing.T, addr string) *h2conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(c, c)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	return &h2conn{t: t, c: c, fr: fr}
}

// call opens stream id as a gRPC call with these extra headers, sending no
// message: the stream stays open.
func (h *h2conn) call(id uint32, extra ...hpack.HeaderField) {
	h.t.Helper()
	var buf bytes.Buffer
	enc := hpack.NewEncoder(&buf)
	for _, f := range append([]hpack.HeaderField{
		{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"},
		{Name: ":path", Value: "/grpc.health.v1.Health/Check"}, {Name: ":authority", Value: "x"},
		{Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
	}, extra...) {
		_ = enc.WriteField(f)
	}
	block := buf.Bytes()
	first := min(len(block), 16<<10)
	if err := h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block[:first], EndHeaders: first == len(block)}); err != nil {
		h.t.Fatal(err)
	}
	for rest := block[first:]; len(rest) > 0; {
		n := min(len(rest), 16<<10)
		if err := h.fr.WriteContinuation(id, n == len(rest), rest[:n]); err != nil {
			h.t.Fatal(err)
		}
		rest = rest[n:]
	}
}

// The server tells every client its bounds, and holds to them with a
// client that ignores them: a stream over MaxConcurrentStreams is refused,
// headers over MaxHeaderListSize reset their stream, and the connection
// goes on serving.
func TestGRPCConnectionBoundsStreamsAndHeaders(t *testing.T) {
	r := start(t, server.HTTPLimits{})
	h := dialH2(t, r.Server.GRPCAddr())
	settings := map[http2.SettingID]uint32{}
	for len(settings) == 0 {
		f, err := h.fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		if sf, ok := f.(*http2.SettingsFrame); ok && !sf.IsAck() {
			_ = sf.ForeachSetting(func(s http2.Setting) error { settings[s.ID] = s.Val; return nil })
			settings[0] = 1 // seen, even if empty
			_ = h.fr.WriteSettingsAck()
		}
	}
	if got := settings[http2.SettingMaxConcurrentStreams]; got != server.MaxConcurrentStreams {
		t.Errorf("advertised MAX_CONCURRENT_STREAMS %d, want %d", got, server.MaxConcurrentStreams)
	}
	if got := settings[http2.SettingMaxHeaderListSize]; got != server.MaxHeaderListSize {
		t.Errorf("advertised MAX_HEADER_LIST_SIZE %d, want %d", got, server.MaxHeaderListSize)
	}

	// MaxConcurrentStreams open streams, one more, then one with headers
	// too large (on a connection whose streams are all taken, it is
	// refused either way: so it goes on a second connection).
	over := uint32(2*server.MaxConcurrentStreams + 1)
	for id := uint32(1); id <= over; id += 2 {
		h.call(id)
	}
	big := dialH2(t, r.Server.GRPCAddr())
	big.call(1, hpack.HeaderField{Name: "x-pad", Value: strings.Repeat("p", server.MaxHeaderListSize)})
	big.call(3)

	for _, c := range []struct {
		h    *h2conn
		id   uint32
		what string
	}{{h, over, "the stream over MaxConcurrentStreams"}, {big, 1, "the stream with headers over MaxHeaderListSize"}} {
		for {
			f, err := c.h.fr.ReadFrame()
			if err != nil {
				t.Fatalf("%s: %v before its RST_STREAM", c.what, err)
			}
			if rst, ok := f.(*http2.RSTStreamFrame); ok {
				if rst.StreamID != c.id {
					t.Fatalf("%s: RST_STREAM of stream %d (%v), want only stream %d's", c.what, rst.StreamID, rst.ErrCode, c.id)
				}
				break
			}
			if f.Header().StreamID == c.id {
				t.Fatalf("%s: %v, want RST_STREAM", c.what, f)
			}
			if s, ok := f.(*http2.SettingsFrame); ok && !s.IsAck() {
				_ = c.h.fr.WriteSettingsAck()
			}
		}
	}
	healthy(t, r, "after the oversized streams")
}

// A gRPC connection is closed (GOAWAY) once it is MaxConnectionAge old, so
// clients reconnect, resolve the service's addresses again and find
// replicas added since: with grpc-go's DNS resolver nothing else makes an
// existing client look.
func TestGRPCConnectionsEndAtTheirMaxAge(t *testing.T) {
	log := servertest.Logger(t)
	srv, err := server.New(context.Background(), "age-test",
		server.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", MaxConnectionAge: time.Second}, server.NewLifecycle(log, 0), log)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	r := servertest.Start(t, srv)
	h := dialH2(t, r.Server.GRPCAddr()) // reads fail after 10 s
	for {
		f, err := h.fr.ReadFrame()
		if err != nil {
			t.Fatalf("no GOAWAY on a connection past its max age of 1s: %v", err)
		}
		if sf, ok := f.(*http2.SettingsFrame); ok && !sf.IsAck() {
			_ = h.fr.WriteSettingsAck()
		}
		if _, ok := f.(*http2.GoAwayFrame); ok {
			return
		}
	}
}
