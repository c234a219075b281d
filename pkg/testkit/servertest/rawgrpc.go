package servertest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// StalledCall is what a server answered to a gRPC call whose request never
// finished arriving (StallGRPCCall).
type StalledCall struct {
	// Status is the call's grpc-status and Message its grpc-message, from
	// the trailers the server sent.
	Status  int
	Message string
	// Sent is how many bytes of the request had been sent when the answer
	// came: the 5-byte prefix and what followed of the message.
	Sent int
}

// StallGRPCCall calls method on the gRPC listener addr over a raw HTTP/2
// connection, with the headers extra besides gRPC's own, and sends the
// 5-byte prefix of a request declaring a message of declared bytes, then
// sent bytes of it (at most HTTP/2's initial window, 65,535, less the
// prefix), and never the rest: what a stranger does to make a server hold
// a request. It returns the status the server answered with, or an error
// when none came within (the server is waiting for the rest).
func StallGRPCCall(addr, method string, declared, sent int, within time.Duration, extra ...hpack.HeaderField) (StalledCall, error) {
	if sent < 0 || sent+5 > 65535 || sent >= declared {
		return StalledCall{}, fmt.Errorf("sent %d of %d bytes: want fewer than declared and at most 65,530", sent, declared)
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return StalledCall{}, err
	}
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(within))
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		return StalledCall{}, err
	}
	fr := http2.NewFramer(c, c)
	if err := fr.WriteSettings(); err != nil {
		return StalledCall{}, err
	}
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, f := range append([]hpack.HeaderField{
		{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"},
		{Name: ":path", Value: method}, {Name: ":authority", Value: addr},
		{Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
	}, extra...) {
		_ = enc.WriteField(f)
	}
	const id = 1
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block.Bytes(), EndHeaders: true}); err != nil {
		return StalledCall{}, err
	}
	msg := make([]byte, 5+sent)
	binary.BigEndian.PutUint32(msg[1:5], uint32(declared))
	for rest := msg; len(rest) > 0; { // frames of HTTP/2's smallest maximum size
		n := min(len(rest), 16<<10)
		if err := fr.WriteData(id, false, rest[:n]); err != nil {
			return StalledCall{}, err
		}
		rest = rest[n:]
	}
	got := StalledCall{Sent: len(msg), Status: -1}
	dec := hpack.NewDecoder(4096, func(f hpack.HeaderField) {
		switch f.Name {
		case "grpc-status":
			if n, err := strconv.Atoi(f.Value); err == nil {
				got.Status = n
			}
		case "grpc-message":
			got.Message = f.Value
		}
	})
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return got, fmt.Errorf("no answer to a stalled call of %s after %d bytes: %w", method, got.Sent, err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = fr.WriteSettingsAck()
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				_ = fr.WritePing(true, f.Data)
			}
		case *http2.HeadersFrame:
			if f.StreamID != id {
				continue
			}
			if _, err := dec.Write(f.HeaderBlockFragment()); err != nil {
				return got, err
			}
			if got.Status >= 0 {
				return got, nil
			}
		case *http2.RSTStreamFrame:
			if f.StreamID == id {
				return got, fmt.Errorf("stream reset (%v) with no gRPC status", f.ErrCode)
			}
		case *http2.GoAwayFrame:
			return got, errors.New("connection closed (GOAWAY) with no gRPC status")
		}
	}
}
