// Package linkcache is the contract between the shortener (which writes links
// through to Redis) and the redirect service (which reads them, and caches
// what PostgreSQL says on a miss): the key of a code, the encoding of its
// entry, the TTLs, and the Pub/Sub channel that tells redirect pods to drop a
// code from their in-process cache.
//
// Ordering rule that keeps Redis from holding a stale answer: the shortener
// writes a changed link's entry with SET (overwrite) only after its
// PostgreSQL transaction committed, from the row as it is then; a reader
// that filled from PostgreSQL writes with SET NX, so it can never overwrite
// a newer entry the shortener wrote meanwhile; and a new link's entry goes
// over nothing or a negative entry only (WriteCreated), so it can never
// overwrite what a change committed after the insert wrote.
package linkcache

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"kurz.dev/pkg/linkrules"
	"kurz.dev/pkg/redisconn"
)

// KeyPrefix starts every link entry's key: "l:<code>", as in the design notes.
// Keys carry no hash tag, so codes spread over every slot of the cluster.
const KeyPrefix = "l:"

// InvalidationChannel is the Redis Pub/Sub channel on which the shortener
// publishes a code after changing its entry. The message is the bare code.
// Delivery is best effort (Pub/Sub keeps nothing for a disconnected
// subscriber); the in-process cache TTL bounds staleness when it is lost.
const InvalidationChannel = "links:invalidate"

// Key returns the Redis key of code's entry.
func Key(code string) string { return KeyPrefix + code }

// Config holds the Redis TTLs, shared by the shortener and the redirect
// service.
type Config struct {
	// TTL is how long an entry for an existing link (active or gone) stays.
	TTL time.Duration `env:"LINK_CACHE_TTL" default:"24h"`
	// NegativeTTL is how long "no such code" stays: short, so a code created
	// behind the shortener's back (or a lost write-through) shows up soon.
	NegativeTTL time.Duration `env:"LINK_NEGATIVE_TTL" default:"60s"`
}

// Validate reports a TTL that cannot work.
func (c Config) Validate() error {
	if c.TTL < time.Second {
		return errors.New("KURZ_LINK_CACHE_TTL must be at least 1s")
	}
	if c.NegativeTTL < time.Second {
		return errors.New("KURZ_LINK_NEGATIVE_TTL must be at least 1s")
	}
	return nil
}

// State is what an entry says about a code.
type State string

const (
	// Active links redirect (unless ExpiresAt has passed).
	Active State = "active"
	// Gone links were revoked (deleted) or disabled: 410.
	Gone State = "gone"
	// Missing means no link has this code: the negative entry, 404.
	Missing State = "missing"
)

// Entry is one code's cached answer.
type Entry struct {
	State State `json:"s"`
	// URL is the target of an Active link.
	URL string `json:"u,omitempty"`
	// Tenant owns the link (empty when Missing); click events carry it.
	Tenant string `json:"t,omitempty"`
	// Status is the link's own redirect status (301, 302, 307, 308); 0 means
	// the redirect service's configured default.
	Status int `json:"r,omitempty"`
	// ExpiresAtMs is the expiry in Unix milliseconds; 0 never expires.
	ExpiresAtMs int64 `json:"x,omitempty"`
	// PasswordHash is the Argon2id hash (PHC string) of a password-protected
	// link's password; empty for an open link.
	PasswordHash string `json:"p,omitempty"`
	// MaxVisits is the number of visits after which the link answers 410; 0
	// means no limit. Visits are counted at VisitsKey(code).
	MaxVisits int64 `json:"m,omitempty"`
	// Targets are per-device destinations; nil when the link has none.
	Targets *Targets `json:"d,omitempty"`
	// Rules are the link's redirect rules and variants, compiled when the
	// entry is decoded; nil when it has none (a plain link's entry has no
	// such field at all).
	Rules *linkrules.Set `json:"g,omitempty"`
}

// Targets are a link's per-device destinations; an empty one means URL.
type Targets struct {
	IOS     string `json:"i,omitempty"`
	Android string `json:"a,omitempty"`
	Desktop string `json:"w,omitempty"`
}

// VisitsKeyPrefix starts the key of a visit-limited link's visit counter:
// "v:<code>", an integer INCRed by the redirect service once per visit. It
// lives as long as the link, since losing it would hand out the visits
// again: the shortener deletes it when the link is deleted, and its
// lifetime follows the link's current expiry (ExpireVisits).
const VisitsKeyPrefix = "v:"

// VisitsKey returns the Redis key of code's visit counter.
func VisitsKey(code string) string { return VisitsKeyPrefix + code }

// VisitsGrace is how long a visit counter outlives its link's expiry, so
// that a redirect whose clock runs behind Redis's never finds a fresh
// counter for a link it still takes for live.
const VisitsGrace = time.Hour

// ExpireVisits sends (or queues, on a pipeline) the command that gives the
// visit counter at key (VisitsKey) the lifetime of a link expiring at
// expiresAtMs (Unix ms; 0 never): PEXPIREAT that expiry plus VisitsGrace,
// or PERSIST for a link that never expires. Either replaces whatever
// lifetime an earlier expiry gave the counter, so a cleared or later
// expiry cannot leave it to end before its link and hand out the spent
// visits again. Neither creates a missing counter (an expiry more than
// VisitsGrace past removes it, as its TTL would have). Both sides send it:
// the redirect with every counted visit, the shortener with every change
// of a link (whose expiry may move with no visit in between).
func ExpireVisits(ctx context.Context, c redis.Cmdable, key string, expiresAtMs int64) *redis.BoolCmd {
	if expiresAtMs == 0 {
		return c.Persist(ctx, key)
	}
	return c.PExpireAt(ctx, key, time.UnixMilli(VisitsExpireAtMs(expiresAtMs)))
}

// VisitsExpireAtMs is when the visit counter of a link expiring at
// expiresAtMs ends (Unix ms): that expiry plus VisitsGrace, or 0 for a
// link that never expires (the counter is made persistent). A script that
// counts a visit sets it in the same step (ExpireVisits' rule, atomically).
func VisitsExpireAtMs(expiresAtMs int64) int64 {
	if expiresAtMs == 0 {
		return 0
	}
	return expiresAtMs + VisitsGrace.Milliseconds()
}

// Expired reports whether an Active entry's expiry has passed at now.
func (e Entry) Expired(now time.Time) bool {
	return e.ExpiresAtMs != 0 && now.UnixMilli() >= e.ExpiresAtMs
}

// FormatVersion is the version of the entries this build writes ("v"),
// the only one it reads. An entry of another version is taken for a miss
// (Read): one older (without "v": before versions, or from a build that
// knew fewer fields, such as a redirect from before passwords that filled
// a protected link without its hash) is replaced by the fill that follows,
// one newer (a later build's, with fields this one cannot honour) is left
// to the builds that wrote it. Bump it whenever a field is added.
const FormatVersion = 2

// ErrOtherFormat is Unmarshal's error for an entry of another
// FormatVersion.
var ErrOtherFormat = errors.New("linkcache: entry of another format version")

// wire is an entry as stored: its format version and its fields.
type wire struct {
	V int `json:"v"`
	Entry
}

// Marshal encodes an entry for Redis (compact JSON, FormatVersion).
func Marshal(e Entry) string {
	b, _ := json.Marshal(wire{V: FormatVersion, Entry: e}) // cannot fail: strings, integers and slices of them
	return string(b)
}

// Unmarshal decodes an entry written by Marshal; ErrOtherFormat for one of
// another FormatVersion.
func Unmarshal(s string) (Entry, error) {
	e, _, err := decode(s)
	return e, err
}

// decode is Unmarshal that also returns the entry's format version.
func decode(s string) (Entry, int, error) {
	var w wire
	if err := json.Unmarshal([]byte(s), &w); err != nil {
		return Entry{}, 0, fmt.Errorf("linkcache: decode entry: %w", err)
	}
	if w.V != FormatVersion {
		return Entry{}, w.V, fmt.Errorf("%w: %d, this build's %d", ErrOtherFormat, w.V, FormatVersion)
	}
	e := w.Entry
	switch e.State {
	case Active:
		if e.URL == "" {
			return Entry{}, w.V, errors.New("linkcache: active entry without a URL")
		}
	case Gone, Missing:
	default:
		return Entry{}, w.V, fmt.Errorf("linkcache: unknown state %q", e.State)
	}
	return e, w.V, nil
}

// Get reads code's entry; found is false when Redis has none (or one of
// another FormatVersion).
func Get(ctx context.Context, rdb redis.Cmdable, code string) (e Entry, found bool, err error) {
	c, err := Read(ctx, rdb, code)
	return c.Entry, c.Found, err
}

// Cached is what Read found.
type Cached struct {
	Entry
	// Found: Redis holds an entry of this build's FormatVersion.
	Found bool
	// Size is the length of its encoding (what a cache of decoded entries
	// weighs them by).
	Size int
	// Stale is the encoding of an older FormatVersion's entry Redis holds
	// instead (taken for a miss): Fill replaces exactly it.
	Stale string
}

// Read reads code's entry.
func Read(ctx context.Context, rdb redis.Cmdable, code string) (Cached, error) {
	s, err := rdb.Get(ctx, Key(code)).Result()
	if errors.Is(err, redis.Nil) {
		return Cached{}, nil
	}
	if err != nil {
		return Cached{}, fmt.Errorf("redis get %s: %w", Key(code), err)
	}
	e, v, err := decode(s)
	if errors.Is(err, ErrOtherFormat) {
		if v > FormatVersion {
			return Cached{}, nil // a newer build's: not ours to replace
		}
		return Cached{Stale: s}, nil
	}
	if err != nil {
		return Cached{}, err
	}
	return Cached{Entry: e, Found: true, Size: len(s)}, nil
}

// WriteThrough overwrites code's entry (replacing any negative entry) and then
// publishes the code on InvalidationChannel. Call it only after the change is
// committed in PostgreSQL.
func WriteThrough(ctx context.Context, rdb redis.Cmdable, code string, e Entry, ttl time.Duration) error {
	if err := rdb.Set(ctx, Key(code), Marshal(e), ttl).Err(); err != nil {
		return fmt.Errorf("redis set %s: %w", Key(code), err)
	}
	if err := rdb.Publish(ctx, InvalidationChannel, code).Err(); err != nil {
		return fmt.Errorf("redis publish %s: %w", InvalidationChannel, err)
	}
	return nil
}

// WriteThroughHeld is WriteThrough that returns only once replicas
// replicas hold the entry (WAIT, sent with the SET and the PUBLISH in one
// round trip to the key's node: redisconn.OnKeyNode), and an error when
// fewer acknowledged it before ctx's deadline (redisconn.QueueWait). Redis
// replicates asynchronously: a master that acknowledged the SET and died
// before its replica had it leaves the promoted replica with the previous
// entry, for its whole TTL; a caller that sees the error keeps the change
// to write again. replicas 0, or an rdb that is not a cluster client (a
// test's fake), writes without WAIT.
func WriteThroughHeld(ctx context.Context, rdb redis.Cmdable, code string, e Entry, ttl time.Duration, replicas int) error {
	kn, ok := rdb.(redisconn.KeyNodes)
	if !ok || replicas == 0 {
		return WriteThrough(ctx, rdb, code, e, ttl)
	}
	_, err := redisconn.OnKeyNode(ctx, kn, Key(code), func(ctx context.Context, node *redis.Client, asking bool) (struct{}, error) {
		return struct{}{}, writeHeld(ctx, node, code, e, ttl, replicas, asking)
	})
	return err
}

// writeHeld is WriteThroughHeld's round trip to c: SET (after ASKING if
// asking), PUBLISH and WAIT.
func writeHeld(ctx context.Context, c redis.Cmdable, code string, e Entry, ttl time.Duration, replicas int, asking bool) error {
	var set *redis.StatusCmd
	var pub *redis.IntCmd
	var wait *redis.Cmd
	_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error {
		if asking {
			p.Do(ctx, "ASKING")
		}
		set = p.Set(ctx, Key(code), Marshal(e), ttl)
		pub = p.Publish(ctx, InvalidationChannel, code)
		wait = redisconn.QueueWait(ctx, p, replicas)
		return nil
	})
	if err := set.Err(); err != nil {
		return fmt.Errorf("redis set %s: %w", Key(code), err)
	}
	if err := pub.Err(); err != nil {
		return fmt.Errorf("redis publish %s: %w", InvalidationChannel, err)
	}
	_, err := redisconn.Held(wait, replicas, "redis set "+Key(code))
	return err
}

// createScript is WriteCreated's: KEYS[1] the entry, ARGV the new entry,
// its TTL in milliseconds, the channel and the code. An entry that is not a
// negative one stays; one Redis cannot decode is replaced.
var createScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
local keep = false
if cur then
	local ok, e = pcall(cjson.decode, cur)
	keep = ok and type(e) == 'table' and e.s ~= 'missing'
end
local written = 0
if not keep then
	redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
	written = 1
end
redis.call('PUBLISH', ARGV[3], ARGV[4])
return written
`)

// WriteCreated stores the entry of a link just inserted, from the row the
// insert returned, and publishes the code on InvalidationChannel; call it
// only after the insert committed. It writes over nothing or a negative
// entry (a read of the code before the insert) only: any other entry was
// written from PostgreSQL after the insert committed, by a change's
// write-through or a reader's fill, and is as new as the insert's state or
// newer. A change committed after the insert whose write-through has not
// run yet overwrites this one when it runs (or its outbox entry does,
// retried), so the insert's state is never what stays. One Redis call;
// written reports whether the entry was set.
func WriteCreated(ctx context.Context, rdb redis.Scripter, code string, e Entry, ttl time.Duration) (written bool, err error) {
	n, err := createScript.Run(ctx, rdb, []string{Key(code)}, createArgs(code, e, ttl)...).Int()
	if err != nil {
		return false, fmt.Errorf("redis write created %s: %w", Key(code), err)
	}
	return n == 1, nil
}

// QueueWriteCreated queues WriteCreated on a pipeline (the script's body
// travels with it, as a node may not hold it yet); its outcome comes from
// the pipeline's Exec.
func QueueWriteCreated(ctx context.Context, pipe redis.Pipeliner, code string, e Entry, ttl time.Duration) *redis.Cmd {
	return createScript.Eval(ctx, pipe, []string{Key(code)}, createArgs(code, e, ttl)...)
}

func createArgs(code string, e Entry, ttl time.Duration) []any {
	return []any{Marshal(e), ttl.Milliseconds(), InvalidationChannel, code}
}

// fillScript is Fill's: KEYS[1] the entry; ARGV the new entry, its TTL in
// milliseconds, and the stale encoding it may replace ("" for none).
var fillScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur and (ARGV[3] == '' or cur ~= ARGV[3]) then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
`)

// Fill stores what a reader found in PostgreSQL where Redis holds nothing,
// or still holds exactly stale (Cached.Stale: an older format's entry the
// reader took for a miss): any other entry appeared in the meantime, and
// a concurrent write-through always wins.
func Fill(ctx context.Context, rdb redis.Cmdable, code string, e Entry, ttl time.Duration, stale string) error {
	if err := fillScript.Run(ctx, rdb, []string{Key(code)}, Marshal(e), ttl.Milliseconds(), stale).Err(); err != nil {
		return fmt.Errorf("redis fill %s: %w", Key(code), err)
	}
	return nil
}
