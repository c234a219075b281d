package config

import (
	"slices"
	"testing"
)

// A typo in a variable's name (KURZ_LIMITER_REDIS_TIMOUT) was ignored
// without a word: the service ran on the default the operator meant to
// change. Unread names what looks meant for the service: a variable of its
// own prefix, or one a letter or two from a variable it reads. Other
// services' variables (a shared ConfigMap, make up's environment) are not
// its business.
func TestUnreadNamesTyposAndUnknownOwnVariables(t *testing.T) {
	read := map[string]bool{
		"KURZ_LIMITER_REDIS_TIMEOUT": true, "KURZ_REDIS_ADDRS": true, "KURZ_LOG_LEVEL": true,
	}
	environ := []string{
		"KURZ_LIMITER_REDIS_TIMOUT=50ms",                 // typo of a read variable
		"KURZ_REDIS_ADDR=10.0.0.1:6379",                  // one letter short
		"KURZ_LIMITER_REPLICA_COUNT=3",                   // own prefix, read by nothing
		"KURZ_SHORTENER_CODE_KEY=not-the-limiters",       // another service's
		"KURZ_REDIS_ADDRS=127.0.0.1:7001",                // read
		"KURZ_PG_PORT=5433",                              // the stack's own
		"kurz_limiter_lower=1",                           // not a kurz variable
		"PATH=/usr/bin",                                  // not a kurz variable
		"KURZ_LIMITER_REDIS_TIMOUT_X=secret=with=equals", // value never looked at
	}
	got := Unread(environ, read, "limiter")
	want := []Unknown{
		{Name: "KURZ_LIMITER_REDIS_TIMOUT", Near: "KURZ_LIMITER_REDIS_TIMEOUT"},
		{Name: "KURZ_LIMITER_REDIS_TIMOUT_X"},
		{Name: "KURZ_LIMITER_REPLICA_COUNT"},
		{Name: "KURZ_REDIS_ADDR", Near: "KURZ_REDIS_ADDRS"},
	}
	if !slices.Equal(got, want) {
		t.Errorf("Unread = %+v\nwant %+v", got, want)
	}
}
