package ratelimit

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// A Fleet is the number of limiter replicas sharing the keys, which the
// local fallback divides a rule by (each replica holds limit/size per key)
// and a lease takes a 1/size share of what is left by. A live fleet follows
// the replicas as they come and go: every replica heartbeats into one Redis
// sorted set (fleet.lua) and reads the live count back in the same call.
//
//   - Scale-up: a new replica counts itself in at once; the others see it
//     at their next heartbeat.
//   - Scale-down: a replica that shuts down leaves the set at once; one
//     that dies is counted until its entry expires (three heartbeats), so
//     the count errs high, which only makes the fallback stricter.
//   - Redis unreachable: the last count read is kept. Replicas added while
//     Redis is down, having read none, use the configured maximum, so a
//     fleet grown from n to m replicas during an outage admits at most
//     limit × (1 + (m−n)/max) < 2 × limit, never the m/n × limit of a
//     count that does not follow.
//   - No count read yet (Redis down at start): the configured maximum, the
//     conservative end.
//
// A static fleet (StaticFleet) is a fixed count, as before fleets existed.
type Fleet struct {
	// beat runs one heartbeat (or, with leave, removes this replica) and
	// returns the live count.
	beat  func(ctx context.Context, leave bool) (int64, error)
	every time.Duration
	max   int64
	size  atomic.Int64
	known atomic.Bool
	log   *slog.Logger
	name  string
	id    string
	// failing is whether the last heartbeat failed (Run's goroutine only):
	// a failure is logged when it starts and when it ends, not per beat.
	failing bool
}

// FleetOptions configure a live fleet.
type FleetOptions struct {
	// Name tells fleets apart on one Redis: the fleet's key is
	// <KeyPrefix>rl:fleet:{Name}. 1 to 64 characters of [A-Za-z0-9._-].
	Name string
	// KeyPrefix goes before the fleet's key, as Options.KeyPrefix before
	// the rules' (ValidKeyPrefix): the limiters of one prefix count
	// themselves apart from another's even under the same fleet name.
	KeyPrefix string
	// ID names this replica in the fleet; empty means the host name and a
	// random suffix, so a restarted replica is a new member.
	ID string
	// Heartbeat is how often this replica renews its entry and reads the
	// count; an entry lives three heartbeats.
	Heartbeat time.Duration
	// MaxReplicas is the count used until one is read: the most replicas
	// the fleet may have (the autoscaler's maximum).
	MaxReplicas int
}

//go:embed fleet.lua
var fleetLua string

var fleetScript = redis.NewScript(fleetLua)

// fleetEntryBeats is how many heartbeats a replica's entry outlives its
// last one: a beat or two lost to a slow Redis does not drop it.
const fleetEntryBeats = 3

var fleetNameRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// ValidFleetName reports whether name can name a fleet.
func ValidFleetName(name string) error {
	if !fleetNameRE.MatchString(name) {
		return fmt.Errorf("fleet name %q: want 1 to 64 characters of A-Z a-z 0-9 . _ -", name)
	}
	return nil
}

// FleetKey is the Redis key of the fleet called name, under the key prefix
// prefix ("" for none).
func FleetKey(prefix, name string) string { return prefix + "rl:fleet:{" + name + "}" }

// NewFleet returns a live fleet heartbeating on rdb once Run runs; until a
// count is read its size is opts.MaxReplicas. Its size is exported as the
// gauge kurz.ratelimit.fleet.replicas.
func NewFleet(rdb redis.Scripter, opts FleetOptions, log *slog.Logger, mp metric.MeterProvider) (*Fleet, error) {
	if err := ValidFleetName(opts.Name); err != nil {
		return nil, err
	}
	if err := ValidKeyPrefix(opts.KeyPrefix); err != nil {
		return nil, fmt.Errorf("ratelimit: fleet: %w", err)
	}
	if opts.Heartbeat <= 0 {
		return nil, errors.New("ratelimit: fleet heartbeat must be positive")
	}
	if opts.MaxReplicas < 1 {
		return nil, errors.New("ratelimit: fleet max replicas must be at least 1")
	}
	if opts.ID == "" {
		opts.ID = replicaID()
	}
	key := FleetKey(opts.KeyPrefix, opts.Name)
	ttl := (fleetEntryBeats * opts.Heartbeat).Milliseconds()
	beat := func(ctx context.Context, leave bool) (int64, error) {
		op := "beat"
		if leave {
			op = "leave"
		}
		return fleetScript.Run(ctx, rdb, []string{key}, opts.ID, ttl, op).Int64()
	}
	f := newFleet(beat, opts.Heartbeat, opts.MaxReplicas, log)
	f.name, f.id = opts.Name, opts.ID
	return f, f.gauge(mp)
}

// newFleet is a live fleet on any heartbeat (unit tests pass a fake).
func newFleet(beat func(context.Context, bool) (int64, error), every time.Duration, maxReplicas int, log *slog.Logger) *Fleet {
	f := &Fleet{beat: beat, every: every, max: int64(max(maxReplicas, 1)), log: log}
	f.size.Store(f.max)
	return f
}

// StaticFleet is a fleet of a fixed n replicas (at least 1): no heartbeat.
func StaticFleet(n int) *Fleet {
	f := &Fleet{max: int64(max(n, 1))}
	f.size.Store(f.max)
	f.known.Store(true)
	return f
}

// Size is the replica count in use: the live count, the last one read, or
// the maximum before any was read.
func (f *Fleet) Size() int { return int(f.size.Load()) }

// Known reports whether Size is a count read from the fleet (or static),
// not the maximum assumed before any was.
func (f *Fleet) Known() bool { return f.known.Load() }

// Run heartbeats every Heartbeat until ctx ends, then takes this replica
// out of the fleet (within a second), so the others' shares grow at once.
// A static fleet returns at once.
func (f *Fleet) Run(ctx context.Context) {
	if f.beat == nil {
		return
	}
	tick := time.NewTicker(f.every)
	defer tick.Stop()
	for {
		f.beatOnce(ctx)
		select {
		case <-ctx.Done():
			f.leave(context.WithoutCancel(ctx))
			return
		case <-tick.C:
		}
	}
}

// beatOnce runs one heartbeat and applies the count it reads; a failure
// keeps the size in use.
func (f *Fleet) beatOnce(ctx context.Context) {
	bctx, cancel := context.WithTimeout(ctx, min(f.every, time.Second))
	n, err := f.beat(bctx, false)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return // shutting down, not Redis failing
		}
		if !f.failing {
			f.failing = true
			kept := "the last count read"
			if !f.Known() {
				kept = "the maximum, no count read yet"
			}
			f.log.Warn("fleet heartbeat failed; the local fallback keeps its replica count", "fleet", f.name, "replicas", f.Size(), "kept", kept, "err", err)
		}
		return
	}
	if f.failing {
		f.failing = false
		f.log.Info("fleet heartbeat back", "fleet", f.name, "replicas", n)
	}
	// The count includes this replica's own entry: below 1 only if Redis
	// lost the key between ZADD and ZCARD, which cannot happen in a script.
	n = max(n, 1)
	old := f.size.Swap(n)
	wasKnown := f.known.Swap(true)
	if old != n || !wasKnown {
		f.log.Info("fleet size changed; local fallback shares follow", "fleet", f.name, "replica", f.id, "from", old, "to", n, "first_count", !wasKnown)
	}
}

// leave takes this replica out of the fleet's count.
func (f *Fleet) leave(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := f.beat(ctx, true); err != nil {
		f.log.Warn("fleet leave failed; this replica is counted until its entry expires", "fleet", f.name, "err", err)
	}
}

// gauge exports Size as kurz.ratelimit.fleet.replicas.
func (f *Fleet) gauge(mp metric.MeterProvider) error {
	attrs := metric.WithAttributeSet(attribute.NewSet(attribute.String("fleet", f.name), attribute.Bool("known", true)))
	unknown := metric.WithAttributeSet(attribute.NewSet(attribute.String("fleet", f.name), attribute.Bool("known", false)))
	_, err := mp.Meter("kurz.dev/services/limiter").Int64ObservableGauge("kurz.ratelimit.fleet.replicas",
		metric.WithUnit("{replica}"),
		metric.WithDescription("Limiter replicas the local fallback divides a rule by; known=false: the configured maximum, no count read yet"),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			if f.Known() {
				o.Observe(f.size.Load(), attrs)
			} else {
				o.Observe(f.size.Load(), unknown)
			}
			return nil
		}))
	return err
}

// replicaID is the host name (the pod's name in Kubernetes) and a random
// suffix.
func replicaID() string {
	host, _ := os.Hostname()
	var b [4]byte
	_, _ = rand.Read(b[:])
	return host + "-" + hex.EncodeToString(b[:])
}
