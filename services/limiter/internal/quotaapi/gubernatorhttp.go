package quotaapi

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"time"

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
// an RPC's error is its HTTP status with {"code", "message", "details"}
// (a batch over 1,000 is 400, OUT_OF_RANGE).
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
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		gatewayError(w, http.StatusMethodNotAllowed, codes.Unimplemented, "POST a GetRateLimitsReq as JSON")
		return
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		gatewayError(w, http.StatusUnsupportedMediaType, codes.InvalidArgument, "Content-Type must be application/json")
		return
	}
	if r.ContentLength > h.maxBody {
		gatewayError(w, http.StatusRequestEntityTooLarge, codes.ResourceExhausted, tooLarge(h.maxBody))
		return
	}
	if !h.inFlight.enter(w) {
		return
	}
	defer h.inFlight.leave()
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.maxBody))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			gatewayError(w, http.StatusRequestEntityTooLarge, codes.ResourceExhausted, tooLarge(h.maxBody))
			return
		}
		gatewayError(w, http.StatusBadRequest, codes.InvalidArgument, "reading the request body failed")
		return
	}
	var req gubernatorpb.GetRateLimitsReq
	if err := gubernatorUnmarshal.Unmarshal(body, &req); err != nil {
		gatewayError(w, http.StatusBadRequest, codes.InvalidArgument, "invalid GetRateLimitsReq JSON: "+textcut.Echo(err.Error(), maxEcho))
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
		st, _ := status.FromError(err)
		switch st.Code() {
		case codes.OutOfRange, codes.InvalidArgument:
			gatewayError(w, http.StatusBadRequest, st.Code(), st.Message())
		default:
			h.log.ErrorContext(r.Context(), "gubernator gateway: call failed", "path", r.URL.Path, "err", err)
			gatewayError(w, http.StatusInternalServerError, codes.Internal, "internal error")
		}
		return
	}
	out, err := gubernatorMarshal.Marshal(resp)
	if err != nil {
		h.log.ErrorContext(r.Context(), "gubernator gateway: response not marshalled", "err", err)
		gatewayError(w, http.StatusInternalServerError, codes.Internal, "internal error")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
}

// gatewayError writes grpc-gateway's error body, which gubernator's HTTP
// clients read: {"code": <gRPC code>, "message": ..., "details": []}.
func gatewayError(w http.ResponseWriter, httpStatus int, c codes.Code, msg string) {
	out, _ := gubernatorMarshal.Marshal(status.New(c, msg).Proto())
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(httpStatus)
	_, _ = w.Write(out)
}
