//go:build integration

package clickevent

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// groupWith makes a stream with a group holding consumers self and idle
// (nothing pending) and holding (one entry pending), all idle past
// threshold, and returns the stream's key and the group.
func groupWith(t *testing.T, rdb *redis.ClusterClient, threshold time.Duration, self, idle, holding string) (key, group string) {
	t.Helper()
	ctx := context.Background()
	key, group = "test-groups:{"+t.Name()+"}", "g"
	rdb.Del(ctx, key)
	t.Cleanup(func() { rdb.Del(context.Background(), key) })
	if err := rdb.XGroupCreateMkStream(ctx, key, group, "0").Err(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{self, idle} {
		if err := rdb.XGroupCreateConsumer(ctx, key, group, name).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: []string{"f", "v"}}).Err(); err != nil {
		t.Fatal(err)
	}
	got, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: holding, Streams: []string{key, ">"}, Count: 1, Block: -1}).Result()
	if err != nil || len(got) != 1 || len(got[0].Messages) != 1 {
		t.Fatalf("reading one entry as %s: %v %v", holding, got, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		cs, err := rdb.XInfoConsumers(ctx, key, group).Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(cs) == 3 && !slices.ContainsFunc(cs, func(c redis.XInfoConsumer) bool { return c.Idle < threshold }) {
			return key, group
		}
		if time.Now().After(deadline) {
			t.Fatalf("consumers not all idle past %v within 10s: %+v", threshold, cs)
		}
		time.Sleep(20 * time.Millisecond) // polling Redis's idle clock
	}
}

func members(t *testing.T, rdb *redis.ClusterClient, key, group string) []string {
	t.Helper()
	cs, err := rdb.XInfoConsumers(context.Background(), key, group).Result()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range cs {
		names = append(names, c.Name)
	}
	slices.Sort(names)
	return names
}

// TestIdleConsumersWithNothingPendingAreForgotten: only the other
// consumers idle past the threshold with no entry pending go; not one
// idle for less, not one holding an entry (deleting it would drop the
// entry from the group), not the caller.
func TestIdleConsumersWithNothingPendingAreForgotten(t *testing.T) {
	ctx := context.Background()
	rdb := clusterClient(t)
	const threshold = 300 * time.Millisecond
	key, group := groupWith(t, rdb, threshold, "a-self", "b-idle", "c-holding")
	if gone, err := ForgetIdleConsumers(ctx, rdb, []string{key}, group, "a-self", time.Hour); err != nil || len(gone) != 0 {
		t.Errorf("forgot %v (err %v) of consumers idle for less than an hour", gone, err)
	}
	gone, err := ForgetIdleConsumers(ctx, rdb, []string{key}, group, "a-self", threshold)
	if err != nil || !slices.Equal(gone, []string{"b-idle"}) {
		t.Errorf("forgot %v (err %v), want only b-idle (c-holding holds an entry, a-self is the caller)", gone, err)
	}
	if got, want := members(t, rdb, key, group), []string{"a-self", "c-holding"}; !slices.Equal(got, want) {
		t.Errorf("left in the group: %v, want %v", got, want)
	}
	if p, err := rdb.XPending(ctx, key, group).Result(); err != nil || p.Count != 1 {
		t.Errorf("pending %v (err %v) after forgetting, want the held entry's 1", p, err)
	}
}

// TestLeaveGroupKeepsAConsumerHoldingEntries: a consumer leaves only with
// nothing pending, and only itself goes.
func TestLeaveGroupKeepsAConsumerHoldingEntries(t *testing.T) {
	ctx := context.Background()
	rdb := clusterClient(t)
	key, group := groupWith(t, rdb, 0, "a-self", "b-idle", "c-holding")
	for _, tc := range []struct {
		name string
		left int
		want []string
	}{
		{"c-holding", 0, []string{"a-self", "b-idle", "c-holding"}},
		{"a-self", 1, []string{"b-idle", "c-holding"}},
		{"a-self", 0, []string{"b-idle", "c-holding"}}, // gone already
	} {
		left, err := LeaveGroup(ctx, rdb, []string{key}, group, tc.name)
		if err != nil || left != tc.left {
			t.Errorf("LeaveGroup(%s) = %v, %v; want %v", tc.name, left, err, tc.left)
		}
		if got := members(t, rdb, key, group); !slices.Equal(got, tc.want) {
			t.Errorf("after %s left: %v, want %v", tc.name, got, tc.want)
		}
	}
	if left, err := LeaveGroup(ctx, rdb, []string{"test-groups:{none}"}, group, "a-self"); left != 0 || err != nil {
		t.Errorf("leaving a stream that does not exist = %v, %v; want 0, nil", left, err)
	}
}
