package linkapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/services/shortener/internal/linkstore"
	"kurz.dev/services/shortener/internal/urlcheck"
)

// ErrorDomain is google.rpc.ErrorInfo.domain of every kurz error.
const ErrorDomain = "kurz.dev"

// Reasons of INVALID_ARGUMENT beyond urlcheck's URL_* reasons, and of the
// other codes that carry an ErrorInfo.
const (
	ReasonAliasInvalid      = "ALIAS_INVALID"
	ReasonAliasReserved     = "ALIAS_RESERVED"
	ReasonAliasTaken        = "ALIAS_TAKEN"
	ReasonModeInvalid       = "MODE_INVALID"
	ReasonExpireTimeInvalid = "EXPIRE_TIME_INVALID"
	ReasonRedirectInvalid   = "REDIRECT_TYPE_INVALID"
	ReasonPageSizeInvalid   = "PAGE_SIZE_INVALID"
	ReasonPageTokenInvalid  = "PAGE_TOKEN_INVALID"
	ReasonUpdateMaskInvalid = "UPDATE_MASK_INVALID"
	ReasonLinkRequired      = "LINK_REQUIRED"
	ReasonRateLimited       = "RATE_LIMITED"
	ReasonLimiterDown       = "RATE_LIMITER_UNAVAILABLE"
	ReasonCodesExhausted    = "RANDOM_CODES_EXHAUSTED"
	ReasonScannerDown       = "URL_SCANNER_UNAVAILABLE"
	ReasonTenantMissing     = "TENANT_REQUIRED"
	ReasonStoreDown         = "LINK_STORE_UNAVAILABLE"
	ReasonTagsInvalid       = "TAGS_INVALID"
	ReasonMaxVisitsInvalid  = "MAX_VISITS_INVALID"
	ReasonPasswordInvalid   = "PASSWORD_INVALID"
	ReasonBatchSizeInvalid  = "BATCH_SIZE_INVALID"
	ReasonHashingBusy       = "PASSWORD_HASHING_BUSY"
)

// invalid is a refused argument: field, machine-readable reason, and a
// message a person can act on.
type invalid struct {
	field, reason, msg string
}

func (e *invalid) Error() string { return e.msg }

func invalidf(field, reason, format string, args ...any) *invalid {
	return &invalid{field: field, reason: reason, msg: fmt.Sprintf(format, args...)}
}

// withDetails attaches details to a status; a failure to do so (it cannot
// happen for these message types) keeps the bare status.
func withDetails(c codes.Code, msg string, details ...protoadapt.MessageV1) error {
	st := status.New(c, msg)
	if withd, err := st.WithDetails(details...); err == nil {
		return withd.Err()
	}
	return st.Err()
}

func badRequest(field, reason, msg string) error {
	return withDetails(codes.InvalidArgument, msg,
		&errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain, Metadata: map[string]string{"field": field}},
		&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: field, Description: msg, Reason: reason}}},
	)
}

// retryLater is RESOURCE_EXHAUSTED or UNAVAILABLE with a retry delay, in
// whole seconds (rounded up), both in the message and as RetryInfo.
func retryLater(c codes.Code, reason, what string, after time.Duration, meta map[string]string) error {
	secs := int64(math.Ceil(after.Seconds()))
	if secs < 1 {
		secs = 1
	}
	return withDetails(c, fmt.Sprintf("%s; retry after %ds", what, secs),
		&errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain, Metadata: meta},
		&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Duration(secs) * time.Second)},
	)
}

// storeUnreachable tells a database that cannot be reached (no connection,
// a connection lost mid-statement) from an error the database answered: the
// former is UNAVAILABLE, worth retrying. A statement cut off before its
// commit changed nothing: PostgreSQL rolls back a transaction whose
// connection dies.
func storeUnreachable(err error) bool {
	var connect *pgconn.ConnectError
	var netErr net.Error
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return false
	}
	return errors.As(err, &connect) || errors.As(err, &netErr) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) ||
		pgconn.SafeToRetry(err)
}

// toStatus is the one place domain errors become gRPC statuses. Anything not
// recognised is logged and answered INTERNAL with a generic message.
func toStatus(ctx context.Context, log *slog.Logger, op string, err error) error {
	var ue *urlcheck.Error
	var inv *invalid
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ue):
		return badRequest("long_url", ue.Reason, ue.Message)
	case errors.As(err, &inv):
		return badRequest(inv.field, inv.reason, inv.msg)
	case errors.Is(err, linkstore.ErrNotFound):
		return status.Error(codes.NotFound, "no such link: check the code (links of other tenants are not visible)")
	case errors.Is(err, linkstore.ErrBadPageToken):
		return badRequest("page_token", ReasonPageTokenInvalid, "page_token is not one this API issued; start again without it")
	case errors.Is(err, linkstore.ErrPageTokenTag):
		return badRequest("page_token", ReasonPageTokenInvalid,
			"page_token belongs to a listing with another tag filter: pass the tag of the call that returned it, or start again without a token")
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, "the request took too long; try again")
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, "the request was cancelled")
	case storeUnreachable(err):
		log.WarnContext(ctx, "link store unreachable", "op", op, "err", err)
		return retryLater(codes.Unavailable, ReasonStoreDown, "the link store is unavailable; nothing was changed", time.Second, nil)
	}
	if _, ok := status.FromError(err); ok {
		return err // already a status, built by this package
	}
	log.ErrorContext(ctx, "request failed", "op", op, "err", err)
	return status.Error(codes.Internal, "internal error; try again later")
}

// itemError is toStatus for one item of a batch: the same code and message
// the item would have got from CreateLink, with the field at fault (from the
// ErrorInfo metadata) when there is one.
func itemError(ctx context.Context, log *slog.Logger, err error) *shortenerv1.BatchItemError {
	st := status.Convert(toStatus(ctx, log, "batch", err))
	e := &shortenerv1.BatchItemError{Code: code.Code(st.Code()).String(), Message: st.Message()}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			e.Field = info.GetMetadata()["field"]
		}
	}
	return e
}
