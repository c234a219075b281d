// Package rulesadmin serves the limiter's RulesAdminService: the rules in
// force exported as a rules file, and a rules file applied to the rule
// tables (rulestore.Export, rulestore.Apply). Only callers holding
// KURZ_SERVICE_AUTH_KEY reach it (the gateway, for its admin routes); the
// limiter verifies their assertions before a byte of the request is read.
package rulesadmin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	limiterv1 "kurz.dev/gen/kurz/limiter/v1"
	"kurz.dev/pkg/callmeta"
	"kurz.dev/pkg/envoydir"
	"kurz.dev/pkg/rpcerr"
	"kurz.dev/services/limiter/internal/ratelimit"
	"kurz.dev/services/limiter/internal/rulestore"
)

// Reasons (google.rpc.ErrorInfo) of ApplyRules's refusals.
const (
	ReasonInvalid        = "RULES_INVALID"
	ReasonPlanInUse      = "PLAN_IN_USE"
	ReasonTenantPlans    = "TENANT_PLANS"
	ReasonRulesFromFile  = "RULES_FROM_FILE"
	ReasonUnreadableRows = "RULE_ROWS_UNREADABLE"
)

// MaxChunk is the largest chunk of a file ApplyRules takes in one message:
// well under the limiter's receive bound (server.LimiterGRPCMaxRecvMsgSize).
const MaxChunk = 32 << 10

// MaxApplyMessages bounds the messages of one ApplyRules: a directory's
// envoydir.MaxFiles files, each in as many messages as a whole
// rulestore.MaxApplyBytes takes in chunks of MaxChunk (32), 32,000 in all.
// The bytes are bounded, but empty messages carry none: without it a
// caller could hold the apply (one at a time) for as long as it sends them.
const MaxApplyMessages = envoydir.MaxFiles * (rulestore.MaxApplyBytes / MaxChunk)

// MaxApplyTime bounds one ApplyRules from the moment it has the apply to
// itself: its messages arriving and the transaction together, so that no
// caller holds the apply longer, however slowly it sends. The gateway
// sends a file it has read whole and waits 4 × KURZ_GATEWAY_CALL_TIMEOUT
// (20 s by default) for the answer; a 1 MiB file takes a few seconds.
const MaxApplyTime = time.Minute

// Server implements RulesAdminService.
type Server struct {
	limiterv1.UnimplementedRulesAdminServiceServer
	// Pool holds the rule tables; nil when the rules come from File
	// (KURZ_LIMITER_RULES_SOURCE=file): they are read, never applied.
	Pool *pgxpool.Pool
	// File is KURZ_LIMITER_RULES_FILE ("" for the built-in one), read as
	// the file source reads it.
	File rulestore.FileSource
	Log  *slog.Logger

	// applying admits one apply at a time in this process: each holds up
	// to a file of rulestore.MaxApplyBytes (the database serialises the
	// applies of every replica anyway).
	applying chan struct{}
	// applyTime bounds an apply once admitted: MaxApplyTime (tests
	// shorten it).
	applyTime time.Duration
}

// New returns a Server on pool (nil: the rules come from file).
func New(pool *pgxpool.Pool, file rulestore.FileSource, log *slog.Logger) *Server {
	return &Server{Pool: pool, File: file, Log: log, applying: make(chan struct{}, 1), applyTime: MaxApplyTime}
}

// GetRules implements RulesAdminService.
func (s *Server) GetRules(ctx context.Context, _ *limiterv1.GetRulesRequest) (*limiterv1.GetRulesResponse, error) {
	var cfg ratelimit.Config
	var err error
	source := "postgres"
	if s.Pool == nil {
		source = "file"
		cfg, err = s.File.Load(ctx)
		cfg.Tenants = nil
	} else {
		cfg, err = rulestore.Export(ctx, s.Pool)
	}
	if err != nil {
		return nil, applyError(ctx, s.Log, err)
	}
	out, err := rulestore.Marshal(cfg)
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.Log, err, nil)
	}
	return &limiterv1.GetRulesResponse{Yaml: string(out), Etag: rulestore.ETag(out), Source: source}, nil
}

// ApplyRules implements RulesAdminService.
func (s *Server) ApplyRules(stream grpc.ClientStreamingServer[limiterv1.ApplyRulesRequest, limiterv1.ApplyRulesResponse]) error {
	ctx := stream.Context()
	if s.Pool == nil {
		file := s.File.Path
		if file == "" {
			file = "built into the limiter (bootstrap.yaml, which only a rebuild changes)"
		}
		return rpcerr.WithDetails(codes.FailedPrecondition,
			fmt.Sprintf("this limiter reads its rules from the file %s (KURZ_LIMITER_RULES_SOURCE=file): edit it; every limiter rereads it each KURZ_LIMITER_RULES_REFRESH", file),
			rpcerr.Info(ReasonRulesFromFile, nil))
	}
	select {
	case s.applying <- struct{}{}:
		defer func() { <-s.applying }()
	case <-ctx.Done():
		return rpcerr.ToStatus(ctx, s.Log, ctx.Err(), nil)
	}
	callCtx := ctx
	ctx, cancel := context.WithTimeout(ctx, s.applyTime)
	defer cancel()
	// Recv waits for the caller and heeds only the call's own end, so it
	// runs on a goroutine of its own and the bound is kept here: returning
	// ends the call, and with it a Recv still waiting.
	arrived := make(chan upload, 1)
	go func() { arrived <- receive(stream) }()
	var up upload
	select {
	case up = <-arrived:
	case <-ctx.Done():
		if callCtx.Err() != nil {
			return rpcerr.ToStatus(callCtx, s.Log, callCtx.Err(), nil)
		}
		return status.Error(codes.DeadlineExceeded, fmt.Sprintf(
			"the rules file did not arrive within %s, the most an apply may take: send its messages without pausing", s.applyTime))
	}
	if up.err != nil {
		return up.err
	}
	opts := up.opts
	var res rulestore.ApplyResult
	var err error
	if up.files != nil {
		res, err = rulestore.ApplyDir(ctx, s.Pool, up.files, opts)
	} else {
		res, err = rulestore.Apply(ctx, s.Pool, up.file, opts)
	}
	if err != nil && errors.Is(err, context.DeadlineExceeded) && callCtx.Err() == nil {
		return status.Error(codes.DeadlineExceeded, fmt.Sprintf(
			"the apply took over %s, the most one may take, and was cancelled: GET the rules to see whether they changed", s.applyTime))
	}
	if err != nil {
		return applyError(ctx, s.Log, err)
	}
	if !opts.DryRun {
		// The first maxLoggedChanges name what changed; a file of
		// thousands of rules would otherwise make one line of megabytes.
		// request_id is the gateway's, to find the HTTP request that made
		// the apply (empty from a caller that sent none, or no sane one).
		logged := res.Changes[:min(len(res.Changes), maxLoggedChanges)]
		changes := make([]string, len(logged))
		for i, c := range logged {
			changes[i] = c.String()
		}
		s.Log.InfoContext(ctx, "rules applied", "format", res.Format, "changes", changes, "changes_not_listed", len(res.Changes)-len(logged),
			"prune", opts.Prune, "etag_before", res.From, "etag", res.ETag, "request_id", callmeta.RequestID(ctx))
	}
	out := &limiterv1.ApplyRulesResponse{Etag: res.ETag, DryRun: opts.DryRun, Format: res.Format}
	for _, c := range res.Changes {
		out.Changes = append(out.Changes, &limiterv1.RuleChange{Kind: c.Kind, Name: c.Name, Change: c.Change, Fields: c.Fields})
	}
	return stream.SendAndClose(out)
}

// upload is what an ApplyRules stream carried: one rules file, or the
// files of a directory, and the options of its first message; or why it
// was refused.
type upload struct {
	file  []byte
	files []envoydir.File
	opts  rulestore.ApplyOptions
	err   error
}

// receive reads stream to its end: one rules file, or (file_name set on
// the first message) the files of a directory, each started by a message
// naming it; at most MaxApplyMessages messages and MaxApplyBytes of
// files.
func receive(stream grpc.ClientStreamingServer[limiterv1.ApplyRulesRequest, limiterv1.ApplyRulesResponse]) upload {
	var up upload
	total := 0
	for n := 0; ; n++ {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return up
		}
		if err != nil {
			return upload{err: err}
		}
		first := n == 0
		if n == MaxApplyMessages {
			return upload{err: rpcerr.BadRequest("rules", ReasonInvalid, fmt.Sprintf(
				"over %d messages: send each file in chunks of up to %d bytes (%d files of %d bytes in all at the most)",
				MaxApplyMessages, MaxChunk, envoydir.MaxFiles, rulestore.MaxApplyBytes))}
		}
		if first {
			up.opts = rulestore.ApplyOptions{DryRun: msg.GetDryRun(), Prune: msg.GetPrune(), IfMatch: msg.GetIfMatch(), MergeDomains: msg.GetMergeDomains()}
		}
		if len(msg.GetChunk()) > MaxChunk {
			return upload{err: rpcerr.BadRequest("chunk", ReasonInvalid, fmt.Sprintf("a chunk of %d bytes: send the file in chunks of at most %d", len(msg.GetChunk()), MaxChunk))}
		}
		total += len(msg.GetChunk())
		if total > rulestore.MaxApplyBytes {
			return upload{err: rpcerr.BadRequest("rules", ReasonInvalid, fmt.Sprintf("the rules file (or files) are over %d bytes (1 MiB), the most one may have", rulestore.MaxApplyBytes))}
		}
		if name := msg.GetFileName(); name != "" {
			if !first && up.files == nil {
				return upload{err: rpcerr.BadRequest("file_name", ReasonInvalid, "a file_name after a rules file's first chunk: name every file of a directory, from the first message on")}
			}
			if len(up.files) == envoydir.MaxFiles {
				return upload{err: rpcerr.BadRequest("file_name", ReasonInvalid, fmt.Sprintf("over %d files: a directory may hold at most %d", envoydir.MaxFiles, envoydir.MaxFiles))}
			}
			if err := envoydir.CheckName(name); err != nil {
				return upload{err: rpcerr.BadRequest("file_name", ReasonInvalid, err.Error())}
			}
			up.files = append(up.files, envoydir.File{Name: name})
		}
		if up.files != nil {
			last := &up.files[len(up.files)-1]
			last.Data = append(last.Data, msg.GetChunk()...)
		} else {
			up.file = append(up.file, msg.GetChunk()...)
		}
	}
}

// maxLoggedChanges bounds the changes an apply's log line names.
const maxLoggedChanges = 100

// applyError is the status of Apply's error: the refusals with their
// reasons and messages (written for the administrator), anything else
// INTERNAL and logged.
func applyError(ctx context.Context, log *slog.Logger, err error) error {
	switch {
	case errors.Is(err, rulestore.ErrInvalid):
		return rpcerr.BadRequest("rules", ReasonInvalid, err.Error())
	case errors.Is(err, rulestore.ErrETagMismatch):
		return rpcerr.WithDetails(codes.Aborted, err.Error(), rpcerr.Info(callmeta.ReasonETagMismatch, nil))
	case errors.Is(err, rulestore.ErrPlanInUse):
		return rpcerr.WithDetails(codes.FailedPrecondition, err.Error(), rpcerr.Info(ReasonPlanInUse, nil))
	case errors.Is(err, rulestore.ErrUnreadableRows):
		return rpcerr.WithDetails(codes.FailedPrecondition, err.Error(), rpcerr.Info(ReasonUnreadableRows, nil))
	case errors.Is(err, rulestore.ErrTenantPlans):
		return rpcerr.WithDetails(codes.FailedPrecondition, err.Error(), rpcerr.Info(ReasonTenantPlans, nil))
	}
	return rpcerr.ToStatus(ctx, log, err, nil)
}
