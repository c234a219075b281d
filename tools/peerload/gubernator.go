package main

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"
)

// Gubernator's API, encoded by hand with protowire so that this command
// does not import gubernator's module (and its older gRPC and OpenTelemetry).
// The field numbers are those of gubernator.proto in v2.13.0:
//
//	GetRateLimitsReq  { repeated RateLimitReq requests = 1; }
//	RateLimitReq      { string name = 1; string unique_key = 2; int64 hits = 3;
//	                    int64 limit = 4; int64 duration = 5; Algorithm algorithm = 6; ... }
//	GetRateLimitsResp { repeated RateLimitResp responses = 1; }
//	RateLimitResp     { Status status = 1; int64 limit = 2; int64 remaining = 3;
//	                    int64 reset_time = 4; string error = 5; ... }
const getRateLimits = "/pb.gubernator.V1/GetRateLimits"

// gubernatorReq is one RateLimitReq. The algorithm is gubernator's default,
// TOKEN_BUCKET (0, so not sent).
type gubernatorReq struct {
	name, key               string
	hits, limit, durationMs int64
}

// gubernatorResp is one RateLimitResp.
type gubernatorResp struct {
	overLimit        bool
	limit, remaining int64
	err              string
}

// marshalGetRateLimits encodes a GetRateLimitsReq of reqs.
func marshalGetRateLimits(reqs ...gubernatorReq) []byte {
	var out []byte
	for _, r := range reqs {
		var m []byte
		m = protowire.AppendTag(m, 1, protowire.BytesType)
		m = protowire.AppendString(m, r.name)
		m = protowire.AppendTag(m, 2, protowire.BytesType)
		m = protowire.AppendString(m, r.key)
		for _, f := range []struct {
			num protowire.Number
			v   int64
		}{{3, r.hits}, {4, r.limit}, {5, r.durationMs}} {
			if f.v != 0 {
				m = protowire.AppendTag(m, f.num, protowire.VarintType)
				m = protowire.AppendVarint(m, uint64(f.v))
			}
		}
		out = protowire.AppendTag(out, 1, protowire.BytesType)
		out = protowire.AppendBytes(out, m)
	}
	return out
}

// unmarshalGetRateLimits decodes a GetRateLimitsResp, skipping the fields
// it does not use.
func unmarshalGetRateLimits(b []byte) ([]gubernatorResp, error) {
	var out []gubernatorResp
	err := eachField(b, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
		if num != 1 || typ != protowire.BytesType {
			return nil
		}
		var r gubernatorResp
		err := eachField(v, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
			switch {
			case num == 1 && typ == protowire.VarintType:
				r.overLimit = x == 1
			case num == 2 && typ == protowire.VarintType:
				r.limit = int64(x)
			case num == 3 && typ == protowire.VarintType:
				r.remaining = int64(x)
			case num == 5 && typ == protowire.BytesType:
				r.err = string(v)
			}
			return nil
		})
		out = append(out, r)
		return err
	})
	return out, err
}

// eachField calls f with every field of the message b: a varint's value in
// x, a length-delimited field's bytes in v.
func eachField(b []byte, f func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("gubernator response: %w", protowire.ParseError(n))
		}
		b = b[n:]
		var v []byte
		var x uint64
		switch typ {
		case protowire.VarintType:
			x, n = protowire.ConsumeVarint(b)
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return fmt.Errorf("gubernator response: field %d: %w", num, protowire.ParseError(n))
		}
		b = b[n:]
		if err := f(num, typ, v, x); err != nil {
			return err
		}
	}
	return nil
}

// rawCodec sends and receives messages already in wire format (*[]byte).
// It is named "proto", the content subtype a gRPC server expects.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) ([]byte, error) {
	b, ok := v.(*[]byte)
	if !ok {
		return nil, fmt.Errorf("raw codec: marshal %T, want *[]byte", v)
	}
	return *b, nil
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	b, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("raw codec: unmarshal into %T, want *[]byte", v)
	}
	*b = append((*b)[:0], data...)
	return nil
}

// gubernatorCheck sends one RateLimitReq and returns its answer.
func gubernatorCheck(ctx context.Context, conn *grpc.ClientConn, r gubernatorReq) (gubernatorResp, error) {
	req := marshalGetRateLimits(r)
	var resp []byte
	if err := conn.Invoke(ctx, getRateLimits, &req, &resp, grpc.ForceCodec(rawCodec{})); err != nil {
		return gubernatorResp{}, err
	}
	rs, err := unmarshalGetRateLimits(resp)
	switch {
	case err != nil:
		return gubernatorResp{}, err
	case len(rs) != 1:
		return gubernatorResp{}, fmt.Errorf("gubernator: %d responses to one request", len(rs))
	case rs[0].err != "":
		return gubernatorResp{}, errors.New("gubernator: " + rs[0].err)
	}
	return rs[0], nil
}
