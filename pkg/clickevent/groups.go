package clickevent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Both consumer groups on the click streams (analytics' and the webhook
// click batcher's) name their consumers per process, so a consumer that
// is never removed stays listed for good. Removing one with entries
// pending would drop them from the group (no one could claim them), so
// the look at its pending count and the deletion run in one script: no
// read can come in between.

// removeScript deletes consumers with nothing pending from group ARGV[1]
// of stream KEYS[1] and returns their names: ARGV[3] alone when ARGV[4]
// is "only", else every consumer but ARGV[3] idle at least ARGV[2] ms.
var removeScript = redis.NewScript(`
local gone = {}
for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do
  local f = {}
  for i = 1, #c, 2 do f[c[i]] = c[i + 1] end
  local picked
  if ARGV[4] == 'only' then
    picked = f.name == ARGV[3]
  else
    picked = f.name ~= ARGV[3] and f.idle >= tonumber(ARGV[2])
  end
  if picked and f.pending == 0 then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], f.name)
    gone[#gone + 1] = f.name
  end
end
return gone
`)

// LeaveGroup removes consumer name from group on every stream of keys
// where it holds no pending entry (they stay, for another consumer to
// claim), and reports on how many it left. A missing stream or group is
// nothing to leave; the other streams are left whatever one's error.
func LeaveGroup(ctx context.Context, rdb redis.Scripter, keys []string, group, name string) (int, error) {
	left, errs := 0, []error(nil)
	for _, key := range keys {
		gone, err := removeConsumers(ctx, rdb, key, group, name, 0, "only")
		left += len(gone)
		errs = append(errs, err)
	}
	return left, errors.Join(errs...)
}

// ForgetIdleConsumers removes from group on every stream of keys each
// consumer but self idle for at least idle with nothing pending (a process
// killed without leaving), and returns their names, once each.
func ForgetIdleConsumers(ctx context.Context, rdb redis.Scripter, keys []string, group, self string, idle time.Duration) ([]string, error) {
	var forgot []string
	var errs []error
	for _, key := range keys {
		gone, err := removeConsumers(ctx, rdb, key, group, self, idle, "except")
		for _, name := range gone {
			if !slices.Contains(forgot, name) {
				forgot = append(forgot, name)
			}
		}
		errs = append(errs, err)
	}
	return forgot, errors.Join(errs...)
}

func removeConsumers(ctx context.Context, rdb redis.Scripter, key, group, name string, idle time.Duration, mode string) ([]string, error) {
	gone, err := removeScript.Run(ctx, rdb, []string{key}, group, idle.Milliseconds(), name, mode).StringSlice()
	if err != nil && (strings.Contains(err.Error(), "NOGROUP") || strings.Contains(err.Error(), "no such key")) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	return gone, nil
}
