// Package rpcerr is kurz's one error contract at the gRPC boundary: the
// google.rpc.ErrorInfo domain every kurz service stamps on the errors it
// builds on purpose, the constructors of those statuses, and ToStatus, the
// one mapping of a service's domain errors to gRPC statuses.
//
// A status whose ErrorInfo carries Domain was written for the caller: the
// gateway passes its message on to API clients. Everything else a handler
// fails with becomes INTERNAL with a generic message; the real error is
// logged, never sent.
package rpcerr

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Domain is google.rpc.ErrorInfo.domain of every kurz error.
const Domain = "kurz.dev"

// Reasons (google.rpc.ErrorInfo.reason) that more than one service gives.
const (
	// ReasonTenantMissing: UNAUTHENTICATED, the call has no tenant and
	// anonymous calls are disabled.
	ReasonTenantMissing = "TENANT_REQUIRED"
	// ReasonRateLimited: RESOURCE_EXHAUSTED, a kurz quota denied the call;
	// metadata "rule" names the deciding rule.
	ReasonRateLimited = "RATE_LIMITED"
	// ReasonLimiterUnavailable: UNAVAILABLE, the limiter did not answer
	// and the caller's policy fails closed.
	ReasonLimiterUnavailable = "RATE_LIMITER_UNAVAILABLE"
)

// Generic messages of the statuses ToStatus makes up itself.
const (
	msgCanceled = "the request was cancelled"
	msgDeadline = "the request took too long; try again"
	msgInternal = "internal error; try again later"
)

// Info is the ErrorInfo of a kurz error: reason in Domain, with metadata
// (nil for none).
func Info(reason string, meta map[string]string) *errdetails.ErrorInfo {
	return &errdetails.ErrorInfo{Reason: reason, Domain: Domain, Metadata: meta}
}

// WithDetails is a status of code c and msg with details attached. A
// failure to attach them (it cannot happen for the errdetails types) keeps
// the bare status.
func WithDetails(c codes.Code, msg string, details ...protoadapt.MessageV1) error {
	st := status.New(c, msg)
	if withd, err := st.WithDetails(details...); err == nil {
		return withd.Err()
	}
	return st.Err()
}

// BadRequest is INVALID_ARGUMENT for one field: an ErrorInfo with reason and
// metadata "field", and a BadRequest field violation, both saying msg, a
// message a person can act on.
func BadRequest(field, reason, msg string) error {
	return BadRequestWith(field, reason, msg, nil)
}

// BadRequestWith is BadRequest with more ErrorInfo metadata than the field
// (what a client can act on, such as the largest batch that passes).
func BadRequestWith(field, reason, msg string, meta map[string]string) error {
	m := map[string]string{"field": field}
	for k, v := range meta {
		m[k] = v
	}
	return WithDetails(codes.InvalidArgument, msg,
		Info(reason, m),
		&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: field, Description: msg, Reason: reason}}},
	)
}

// RetryLater is a status of code c (RESOURCE_EXHAUSTED or UNAVAILABLE) that
// says what happened and when to retry: after, in whole seconds rounded up
// (at least one), both in the message ("<what>; retry after 3s") and as a
// google.rpc.RetryInfo, next to an ErrorInfo with reason and meta.
func RetryLater(c codes.Code, reason, what string, after time.Duration, meta map[string]string) error {
	secs := max(int64(math.Ceil(after.Seconds())), 1)
	return WithDetails(c, fmt.Sprintf("%s; retry after %ds", what, secs),
		Info(reason, meta),
		&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Duration(secs) * time.Second)},
	)
}

// Invalid is a refused argument: the field at fault, a machine-readable
// reason, and a message a person can act on. ToStatus answers it as
// BadRequest, wrapped or not.
type Invalid struct {
	Field, Reason, Message string
}

// Invalidf is an *Invalid with a formatted message.
func Invalidf(field, reason, format string, args ...any) *Invalid {
	return &Invalid{Field: field, Reason: reason, Message: fmt.Sprintf(format, args...)}
}

func (e *Invalid) Error() string { return e.Message }

// Status is the answer to the refused argument: BadRequest.
func (e *Invalid) Status() error { return BadRequest(e.Field, e.Reason, e.Message) }

// Details returns the details of a kurz status: its ErrorInfo, BadRequest
// and RetryInfo, each nil where absent (and all nil for an error that is
// not a status).
func Details(err error) (info *errdetails.ErrorInfo, br *errdetails.BadRequest, retry *errdetails.RetryInfo) {
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			info = d
		case *errdetails.BadRequest:
			br = d
		case *errdetails.RetryInfo:
			retry = d
		}
	}
	return info, br, retry
}

// Sentinel is one row of a service's error table: the status a client gets
// for an error that is Err (errors.Is).
type Sentinel struct {
	Err  error
	Code codes.Code
	// Reason, when set, adds an ErrorInfo in Domain.
	Reason string
	// Field, when set, makes the status a BadRequest of that field (Code
	// must be INVALID_ARGUMENT, Reason set).
	Field string
	// Message is what the client reads: written for a person, naming
	// nothing internal.
	Message string
	// RetryAfter, when set, makes the status a RetryLater (Reason must be
	// set).
	RetryAfter time.Duration
}

// status builds the row's status.
func (s Sentinel) status() error {
	switch {
	case s.Field != "":
		return BadRequest(s.Field, s.Reason, s.Message)
	case s.RetryAfter > 0:
		return RetryLater(s.Code, s.Reason, s.Message, s.RetryAfter, nil)
	case s.Reason != "":
		return WithDetails(s.Code, s.Message, Info(s.Reason, nil))
	}
	return status.Error(s.Code, s.Message)
}

// ToStatus is the one place a handler's error becomes a gRPC status, by the
// first of:
//
//   - an *Invalid (errors.As): its BadRequest;
//   - a row of table that err is (errors.Is), in the table's order: its code,
//     reason and message; the real error is logged when the code is a fault
//     on the server's side (UNAVAILABLE, DEADLINE_EXCEEDED, INTERNAL, ...);
//   - context.DeadlineExceeded or context.Canceled: DEADLINE_EXCEEDED or
//     CANCELLED (a table row for either rewords it);
//   - an error that already is a status (built on purpose by the handler):
//     unchanged;
//   - anything else: INTERNAL with a generic message, the error logged.
//
// nil stays nil. log may carry the operation's attributes (log.With("op",
// ...)).
func ToStatus(ctx context.Context, log *slog.Logger, err error, table []Sentinel) error {
	if err == nil {
		return nil
	}
	var inv *Invalid
	if errors.As(err, &inv) {
		return inv.Status()
	}
	for _, s := range table {
		if errors.Is(err, s.Err) {
			if serverFault(s.Code) {
				log.WarnContext(ctx, "request failed", "code", s.Code.String(), "err", err)
			}
			return s.status()
		}
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, msgDeadline)
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, msgCanceled)
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	log.ErrorContext(ctx, "request failed", "code", codes.Internal.String(), "err", err)
	return status.Error(codes.Internal, msgInternal)
}

// serverFault reports whether c is a failure on the server's side, one an
// operator wants in the log.
func serverFault(c codes.Code) bool {
	switch c {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Internal, codes.Unknown, codes.DataLoss:
		return true
	}
	return false
}
