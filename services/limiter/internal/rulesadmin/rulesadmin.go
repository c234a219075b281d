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

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

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
}

// New returns a Server on pool (nil: the rules come from file).
func New(pool *pgxpool.Pool, file rulestore.FileSource, log *slog.Logger) *Server {
	return &Server{Pool: pool, File: file, Log: log, applying: make(chan struct{}, 1)}
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
	// One rules file, or (file_name set on the first message) the files
	// of a directory, each started by a message naming it.
	var file []byte
	var files []envoydir.File
	var opts rulestore.ApplyOptions
	total := 0
	for first := true; ; first = false {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		if first {
			opts = rulestore.ApplyOptions{DryRun: msg.GetDryRun(), Prune: msg.GetPrune(), IfMatch: msg.GetIfMatch(), MergeDomains: msg.GetMergeDomains()}
		}
		if len(msg.GetChunk()) > MaxChunk {
			return rpcerr.BadRequest("chunk", ReasonInvalid, fmt.Sprintf("a chunk of %d bytes: send the file in chunks of at most %d", len(msg.GetChunk()), MaxChunk))
		}
		total += len(msg.GetChunk())
		if total > rulestore.MaxApplyBytes {
			return rpcerr.BadRequest("rules", ReasonInvalid, fmt.Sprintf("the rules file (or files) are over %d bytes (1 MiB), the most one may have", rulestore.MaxApplyBytes))
		}
		if name := msg.GetFileName(); name != "" {
			if !first && files == nil {
				return rpcerr.BadRequest("file_name", ReasonInvalid, "a file_name after a rules file's first chunk: name every file of a directory, from the first message on")
			}
			if len(files) == envoydir.MaxFiles {
				return rpcerr.BadRequest("file_name", ReasonInvalid, fmt.Sprintf("over %d files: a directory may hold at most %d", envoydir.MaxFiles, envoydir.MaxFiles))
			}
			if err := envoydir.CheckName(name); err != nil {
				return rpcerr.BadRequest("file_name", ReasonInvalid, err.Error())
			}
			files = append(files, envoydir.File{Name: name})
		}
		if files != nil {
			last := &files[len(files)-1]
			last.Data = append(last.Data, msg.GetChunk()...)
		} else {
			file = append(file, msg.GetChunk()...)
		}
	}
	var res rulestore.ApplyResult
	var err error
	if files != nil {
		res, err = rulestore.ApplyDir(ctx, s.Pool, files, opts)
	} else {
		res, err = rulestore.Apply(ctx, s.Pool, file, opts)
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
