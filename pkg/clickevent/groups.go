package clickevent

import (
	"context"
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

// LeaveGroup removes consumer name from group on stream key unless it
// holds pending entries (they stay, for another consumer to claim), and
// reports whether it left. A missing stream or group is nothing to leave.
func LeaveGroup(ctx context.Context, rdb redis.Scripter, key, group, name string) (bool, error) {
	gone, err := removeConsumers(ctx, rdb, key, group, name, 0, "only")
	return len(gone) > 0, err
}

// ForgetIdleConsumers removes from group on stream key every consumer but
// self idle for at least idle with nothing pending (a process killed
// without leaving), and returns their names.
func ForgetIdleConsumers(ctx context.Context, rdb redis.Scripter, key, group, self string, idle time.Duration) ([]string, error) {
	return removeConsumers(ctx, rdb, key, group, self, idle, "except")
}

func removeConsumers(ctx context.Context, rdb redis.Scripter, key, group, name string, idle time.Duration, mode string) ([]string, error) {
	gone, err := removeScript.Run(ctx, rdb, []string{key}, group, idle.Milliseconds(), name, mode).StringSlice()
	if err != nil && (strings.Contains(err.Error(), "NOGROUP") || strings.Contains(err.Error(), "no such key")) {
		return nil, nil
	}
	return gone, err
}
