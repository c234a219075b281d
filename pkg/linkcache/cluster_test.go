//go:build integration

package linkcache

import (
	"context"
	"crypto/rand"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"kurz.dev/pkg/redisconn"
)

// TestFillNeverOverwritesWriteThrough runs against the local Redis Cluster.
func TestFillNeverOverwritesWriteThrough(t *testing.T) {
	ctx := context.Background()
	rdb := clusterClient(t)
	code := "lcT" + rand.Text()[:10]
	t.Cleanup(func() { rdb.Del(context.Background(), Key(code)) })

	sub := rdb.Subscribe(ctx, InvalidationChannel)
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil { // the subscription confirmation
		t.Fatal(err)
	}

	if err := Fill(ctx, rdb, code, Entry{State: Missing}, time.Minute, ""); err != nil {
		t.Fatal(err)
	}
	active := Entry{State: Active, URL: "https://example.com/", Tenant: "t"}
	if err := WriteThrough(ctx, rdb, code, active, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := Fill(ctx, rdb, code, Entry{State: Missing}, time.Minute, ""); err != nil {
		t.Fatal(err)
	}
	got, found, err := Get(ctx, rdb, code)
	if err != nil || !found || got != active {
		t.Fatalf("after write-through then a stale fill: got %+v found=%v err=%v, want %+v", got, found, err, active)
	}
	if ttl := rdb.TTL(ctx, Key(code)).Val(); ttl <= time.Minute {
		t.Errorf("TTL %v: want the write-through's hour, not the negative minute", ttl)
	}
	awaitInvalidation(t, sub, code)
}

// An entry of an older format (a redirect from before passwords filled a
// protected link without its hash) reads as a miss carrying its encoding,
// and the fill that follows replaces exactly it: not an entry written in
// between, not a newer format's entry (which reads as a plain miss).
func TestAnOlderFormatsEntryIsReplacedByTheFill(t *testing.T) {
	ctx := context.Background()
	rdb := clusterClient(t)
	code := "lcF" + rand.Text()[:10]
	t.Cleanup(func() { rdb.Del(context.Background(), Key(code)) })
	const old = `{"s":"active","u":"https://example.com/secret","t":"t"}`
	if err := rdb.Set(ctx, Key(code), old, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	c, err := Read(ctx, rdb, code)
	if err != nil || c.Found || c.Stale != old {
		t.Fatalf("Read of an older format's entry: %+v, %v; want a miss carrying it", c, err)
	}
	protected := Entry{State: Active, URL: "https://example.com/secret", Tenant: "t", PasswordHash: "$argon2id$v=19$m=19456,t=2,p=1$c2FsdA$aGFzaA"}
	if err := Fill(ctx, rdb, code, protected, time.Hour, `{"s":"gone"}`); err != nil {
		t.Fatal(err)
	}
	if got, _ := rdb.Get(ctx, Key(code)).Result(); got != old {
		t.Fatalf("a fill naming another stale value replaced %s with %s", old, got)
	}
	if err := Fill(ctx, rdb, code, protected, time.Hour, c.Stale); err != nil {
		t.Fatal(err)
	}
	if got, found, err := Get(ctx, rdb, code); err != nil || !found || got != protected {
		t.Fatalf("after the fill: %+v found=%v err=%v; want the entry with its password", got, found, err)
	}
	newer := `{"v":99,"s":"active","u":"https://example.com/secret","t":"t","zz":1}`
	if err := rdb.Set(ctx, Key(code), newer, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	if c, err := Read(ctx, rdb, code); err != nil || c.Found || c.Stale != "" {
		t.Fatalf("Read of a newer format's entry: %+v, %v; want a plain miss", c, err)
	}
	if err := Fill(ctx, rdb, code, protected, time.Hour, ""); err != nil {
		t.Fatal(err)
	}
	if got, _ := rdb.Get(ctx, Key(code)).Result(); got != newer {
		t.Errorf("a fill replaced a newer format's entry with %s", got)
	}
}

// TestWriteCreatedKeepsAnyNewerEntry runs the create script on the local
// Redis Cluster: a new link's entry goes over nothing or a negative entry,
// never over what a change or a reader wrote after the insert, and the code
// is published every time (also from a pipeline, where the script's body
// travels with the call).
func TestWriteCreatedKeepsAnyNewerEntry(t *testing.T) {
	ctx := context.Background()
	rdb := clusterClient(t)
	run := "lcC" + rand.Text()[:10]
	sub := rdb.Subscribe(ctx, InvalidationChannel)
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil { // the subscription confirmation
		t.Fatal(err)
	}
	created := Entry{State: Active, URL: "https://example.com/new", Tenant: "t"}
	gone := Entry{State: Gone, Tenant: "t"}
	filled := Entry{State: Active, URL: "https://example.com/changed", Tenant: "t"}
	for _, tc := range []struct {
		name   string
		before *Entry // nil: no entry
		want   Entry
	}{
		{"none", nil, created},
		{"negative", &Entry{State: Missing}, created},
		{"deleted since", &gone, gone},
		{"changed since", &filled, filled},
	} {
		for _, piped := range []bool{false, true} {
			code := fmt.Sprintf("%s-%s-%v", run, strings.ReplaceAll(tc.name, " ", "-"), piped)
			t.Cleanup(func() { rdb.Del(context.Background(), Key(code)) })
			if tc.before != nil {
				if err := rdb.Set(ctx, Key(code), Marshal(*tc.before), time.Hour).Err(); err != nil {
					t.Fatal(err)
				}
			}
			var written bool
			var err error
			if piped {
				pipe := rdb.Pipeline()
				cmd := QueueWriteCreated(ctx, pipe, code, created, 2*time.Hour)
				if _, err := pipe.Exec(ctx); err != nil {
					t.Fatalf("%s (pipelined): %v", tc.name, err)
				}
				n, _ := cmd.Int()
				written = n == 1
			} else if written, err = WriteCreated(ctx, rdb, code, created, 2*time.Hour); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			got, found, err := Get(ctx, rdb, code)
			if err != nil || !found || got != tc.want || written != (tc.want == created) {
				t.Errorf("%s (pipelined %v): entry %+v found=%v written=%v err=%v, want %+v", tc.name, piped, got, found, written, err, tc.want)
			}
			if ttl := rdb.TTL(ctx, Key(code)).Val(); written && ttl <= time.Hour {
				t.Errorf("%s (pipelined %v): TTL %v, want the create's two hours", tc.name, piped, ttl)
			}
			awaitInvalidation(t, sub, code)
		}
	}
}

// awaitInvalidation reads sub until code is published (bounded).
func awaitInvalidation(t *testing.T, sub *redis.PubSub, code string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for {
		msg, err := sub.ReceiveMessage(ctx)
		if err != nil {
			t.Fatalf("no invalidation for %s: %v", code, err)
		}
		if msg.Payload == code {
			return
		}
	}
}

// clusterClient connects to the local Redis Cluster, closed with the test.
func clusterClient(t *testing.T) *redis.ClusterClient {
	t.Helper()
	rdb, err := redisconn.New(context.Background(), redisconn.Config{
		Addrs:       []string{"127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"},
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second, PoolSize: 4,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })
	return rdb
}
