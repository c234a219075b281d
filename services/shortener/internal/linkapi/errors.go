package linkapi

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/callmeta"
	"kurz.dev/pkg/rpcerr"
	"kurz.dev/services/shortener/internal/linkstore"
	"kurz.dev/services/shortener/internal/urlcheck"
)

// Reasons of INVALID_ARGUMENT beyond urlcheck's URL_* reasons, and of the
// other codes that carry an ErrorInfo (shared ones are in rpcerr).
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
	ReasonLimiterDown       = rpcerr.ReasonLimiterUnavailable
	ReasonCodesExhausted    = "RANDOM_CODES_EXHAUSTED"
	// ReasonFromURLExhausted: every candidate code of the URL is taken.
	ReasonFromURLExhausted = "FROM_URL_CODES_EXHAUSTED"
	ReasonScannerDown      = "URL_SCANNER_UNAVAILABLE"
	ReasonStoreDown        = "LINK_STORE_UNAVAILABLE"
	ReasonTagsInvalid      = "TAGS_INVALID"
	ReasonTitleInvalid     = "TITLE_INVALID"
	ReasonMaxVisitsInvalid = "MAX_VISITS_INVALID"
	ReasonPasswordInvalid  = "PASSWORD_INVALID"
	ReasonBatchSizeInvalid = "BATCH_SIZE_INVALID"
	// MetaMaxBatch is the ErrorInfo metadata key of a BATCH_SIZE_INVALID
	// that the quota caused: the largest batch that can pass.
	MetaMaxBatch      = "max_batch"
	ReasonHashingBusy = "PASSWORD_HASHING_BUSY"

	// ReasonFromURLTenantRequired: CODE_MODE_FROM_URL asked by an anonymous
	// caller (PERMISSION_DENIED on mode): anonymous callers share a tenant.
	ReasonFromURLTenantRequired = "FROM_URL_TENANT_REQUIRED"

	// ReasonAliasTenantRequired: a custom alias asked by an anonymous
	// caller (PERMISSION_DENIED on custom_alias): nobody can delete an
	// anonymous link, so its alias would be taken for good.
	ReasonAliasTenantRequired = "ALIAS_TENANT_REQUIRED"

	// ReasonAliasNotRedirecting: a batch item's alias is the caller's
	// link to the same URL, which no longer redirects (FAILED_PRECONDITION
	// on custom_alias).
	ReasonAliasNotRedirecting = "ALIAS_NOT_REDIRECTING"
)

// linkErrors are the link store's sentinel errors as clients see them.
var linkErrors = []rpcerr.Sentinel{
	{Err: linkstore.ErrDomainGone, Code: codes.FailedPrecondition, Reason: ReasonDomainNotVerified, Field: "domain",
		Message: "domain: the link's domain stopped being one of your verified domains while it was created (deleted meanwhile?); nothing was created"},
	{Err: linkstore.ErrChanged, Code: codes.Aborted, Reason: callmeta.ReasonETagMismatch,
		Message: "the link changed since you read it (its etag is not the one given): read it again, then apply your change to what it is now"},
	{Err: linkstore.ErrNotFound, Code: codes.NotFound,
		Message: "no such link: check the code (links of other tenants are not visible)"},
	{Err: linkstore.ErrBadPageToken, Code: codes.InvalidArgument, Reason: ReasonPageTokenInvalid, Field: "page_token",
		Message: "page_token is not one this API issued; start again without it"},
	{Err: linkstore.ErrPageTokenTag, Code: codes.InvalidArgument, Reason: ReasonPageTokenInvalid, Field: "page_token",
		Message: "page_token belongs to a listing with another tag filter: pass the tag of the call that returned it, or start again without a token"},
	{Err: linkstore.ErrPageTokenTenant, Code: codes.InvalidArgument, Reason: ReasonPageTokenInvalid, Field: "page_token",
		Message: "page_token was issued to another tenant: send it with an API key of the tenant that listed, or start again without a token"},
}

// storeUnreachable tells a database that cannot be reached (no connection,
// a connection lost mid-statement) from an error the database answered: the
// former is UNAVAILABLE, worth retrying. A statement cut off before its
// commit changed nothing: PostgreSQL rolls back a transaction whose
// connection dies. The request's own cancellation or deadline is not the
// store's fault (context.DeadlineExceeded is a net.Error).
func storeUnreachable(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
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

// toStatus is the one place domain errors become gRPC statuses: a refused
// URL and an unreachable store here, the rest by rpcerr.ToStatus (refused
// arguments, the link store's sentinels by linkErrors, INTERNAL with a
// generic message for anything not recognised).
func toStatus(ctx context.Context, log *slog.Logger, op string, err error) error {
	var ue *urlcheck.Error
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ue):
		return rpcerr.BadRequest("long_url", ue.Reason, ue.Message)
	case storeUnreachable(err):
		log.WarnContext(ctx, "link store unreachable", "op", op, "err", err)
		return rpcerr.RetryLater(codes.Unavailable, ReasonStoreDown, "the link store is unavailable; nothing was changed", time.Second, nil)
	}
	return rpcerr.ToStatus(ctx, log.With("op", op), err, linkErrors)
}

// itemError is toStatus for one item of a batch: the same code and message
// the item would have got from CreateLink, with the field at fault (from the
// ErrorInfo metadata) when there is one.
func itemError(ctx context.Context, log *slog.Logger, err error) *shortenerv1.BatchItemError {
	err = toStatus(ctx, log, "batch", err)
	st := status.Convert(err)
	info, _, _ := rpcerr.Details(err)
	return &shortenerv1.BatchItemError{Code: code.Code(st.Code()).String(), Message: st.Message(), Field: info.GetMetadata()["field"]}
}
