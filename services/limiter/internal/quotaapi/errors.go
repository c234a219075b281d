package quotaapi

import (
	"fmt"

	"google.golang.org/grpc/codes"

	"kurz.dev/pkg/rpcerr"
)

// Reasons (google.rpc.ErrorInfo.reason) of the limiter's errors.
const (
	ReasonDomainRequired     = "DOMAIN_REQUIRED"
	ReasonDomainUnknown      = "DOMAIN_UNKNOWN"
	ReasonDescriptorsInvalid = "DESCRIPTORS_INVALID"
	ReasonCostInvalid        = "COST_INVALID"
	ReasonBatchSizeInvalid   = "BATCH_SIZE_INVALID"
	// ReasonStateUnavailable: UNAVAILABLE, ExplainQuota could not read the
	// rules' state in Redis.
	ReasonStateUnavailable = "RATE_LIMIT_STATE_UNAVAILABLE"
)

// inCheck is a refusal of checks[i] of a CheckQuotas call: the field under
// that check, the message naming it.
func inCheck(inv *rpcerr.Invalid, i int) *rpcerr.Invalid {
	name := fmt.Sprintf("checks[%d]", i)
	return &rpcerr.Invalid{Field: name + "." + inv.Field, Reason: inv.Reason, Message: name + ": " + inv.Message}
}

// stateUnavailable answers an ExplainQuota whose Redis reads failed.
func stateUnavailable() error {
	return rpcerr.RetryLater(codes.Unavailable, ReasonStateUnavailable, "rate-limit state is unreachable right now", 0, nil)
}
