package quotaapi

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	gubernatorpb "kurz.dev/gen/pb/gubernator"
	"kurz.dev/pkg/textcut"
)

// GubernatorHTTP serves gubernator's HTTP gateway over svc: POST
// /v1/GetRateLimits (a GetRateLimitsReq as JSON), GET /v1/HealthCheck and
// GET /v1/LiveCheck, answered as gubernator's grpc-gateway answers: the
// response as JSON with the proto's field names and every field present
// (int64s as strings, protojson's rule), unknown request fields ignored;
// an RPC's error is the HTTP status grpc-gateway gives its code
// (runtime.HTTPStatusFromCode: a batch over 1,000 is 400, OUT_OF_RANGE;
// UNAVAILABLE 503, DEADLINE_EXCEEDED 504, RESOURCE_EXHAUSTED 429) with
// {"code", "message", "details"}, an internal error's message withheld.
//
// Stricter than gubernator, for the reasons POST /json is (EnvoyJSON):
// only Content-Type application/json (415), a body of at most maxBody
// (413), within inFlight's bound (503), each call bounded by timeout.
type GubernatorHTTP struct {
	svc      gubernatorpb.V1Server
	maxBody  int64
	inFlight *InFlight
	timeout  time.Duration
	log      *slog.Logger
}

// NewGubernatorHTTP returns gubernator's HTTP gateway over svc; see
// GubernatorHTTP.
func NewGubernatorHTTP(svc gubernatorpb.V1Server, maxBody int64, inFlight *InFlight, timeout time.Duration, log *slog.Logger) *GubernatorHTTP {
	return &GubernatorHTTP{svc: svc, maxBody: maxBody, inFlight: inFlight, timeout: timeout, log: log}
}

// Register adds the gateway's routes to mux.
func (h *GubernatorHTTP) Register(mux *http.ServeMux) {
	mux.HandleFunc("/v1/GetRateLimits", h.getRateLimits)
	mux.HandleFunc("GET /v1/HealthCheck", func(w http.ResponseWriter, r *http.Request) {
		resp, err := h.svc.HealthCheck(r.Context(), &gubernatorpb.HealthCheckReq{})
		h.answer(w, r, resp, err)
	})
	mux.HandleFunc("GET /v1/LiveCheck", func(w http.ResponseWriter, r *http.Request) {
		resp, err := h.svc.LiveCheck(r.Context(), &gubernatorpb.LiveCheckReq{})
		h.answer(w, r, resp, err)
	})
}

// gubernatorJSON is gubernator's gateway's JSON: the proto's names, every
// field written, unknown fields read past.
var (
	gubernatorMarshal   = protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}
	gubernatorUnmarshal = protojson.UnmarshalOptions{DiscardUnknown: true}
)

func (h *GubernatorHTTP) getRateLimits(w http.ResponseWriter, r *http.Request) {
	body, done, ok := readJSONPost(w, r, "GetRateLimitsReq", h.maxBody, h.inFlight, gatewayError)
	if !ok {
		return
	}
	defer done()
	var req gubernatorpb.GetRateLimitsReq
	if err := gubernatorUnmarshal.Unmarshal(body, &req); err != nil {
		gatewayError(w, http.StatusBadRequest, "invalid GetRateLimitsReq JSON: "+textcut.Echo(err.Error(), maxEcho))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.timeout)
	defer cancel()
	resp, err := h.svc.GetRateLimits(ctx, &req)
	h.answer(w, r.WithContext(ctx), resp, err)
}

// answer writes an RPC's outcome as the gateway does.
func (h *GubernatorHTTP) answer(w http.ResponseWriter, r *http.Request, resp proto.Message, err error) {
	if err != nil {
		st, ok := status.FromError(err)
		if !ok {
			st = status.FromContextError(err) // a deadline's or a cancel's; UNKNOWN else
		}
		switch st.Code() {
		case codes.Unknown, codes.Internal, codes.DataLoss:
			// Nothing the client acts on, and the text may name internal
			// addresses.
			h.log.ErrorContext(r.Context(), "gubernator gateway: call failed", "path", r.URL.Path, "err", err)
			gatewayError(w, http.StatusInternalServerError, "internal error")
		default:
			// grpc-gateway's own table, so a gubernator client reads the
			// status it would from gubernator: 503 and 429 retried, 504 a
			// deadline, 400 its own mistake.
			writeStatus(w, runtime.HTTPStatusFromCode(st.Code()), st)
		}
		return
	}
	out, err := gubernatorMarshal.Marshal(resp)
	if err != nil {
		h.log.ErrorContext(r.Context(), "gubernator gateway: response not marshalled", "err", err)
		gatewayError(w, http.StatusInternalServerError, "internal error")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
}

// gatewayError writes grpc-gateway's error body for httpStatus, with the
// gRPC code grpc-gateway maps to that status.
func gatewayError(w http.ResponseWriter, httpStatus int, msg string) {
	c := codes.Unknown
	switch httpStatus {
	case http.StatusBadRequest, http.StatusUnsupportedMediaType:
		c = codes.InvalidArgument
	case http.StatusMethodNotAllowed:
		c = codes.Unimplemented
	case http.StatusRequestEntityTooLarge:
		c = codes.ResourceExhausted
	case http.StatusInternalServerError:
		c = codes.Internal
	}
	writeStatus(w, httpStatus, status.New(c, msg))
}

// writeStatus writes grpc-gateway's error body, which gubernator's HTTP
// clients read: {"code": <gRPC code>, "message": ..., "details": []}.
func writeStatus(w http.ResponseWriter, httpStatus int, st *status.Status) {
	out, _ := gubernatorMarshal.Marshal(st.Proto())
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(httpStatus)
	_, _ = w.Write(out)
}
