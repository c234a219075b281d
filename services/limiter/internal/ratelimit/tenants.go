package ratelimit

import (
	"hash/maphash"
	"maps"
)

// tenantShards is how many maps TenantPlans spreads its tenants over: With
// copies only the shards its changes touch, 1/256 of the tenants each.
const tenantShards = 256

var tenantSeed = maphash.MakeSeed()

// TenantPlans maps tenants to their plans. It is immutable and shared by
// every Ruleset built from it; With changes a few tenants without copying
// the rest, so one tenant's plan change costs about the same at 500,000
// tenants as at 50.
type TenantPlans struct {
	shards [tenantShards]map[string]string
	n      int
}

// NewTenantPlans returns plans (tenant to plan; empty plans are left out),
// copied.
func NewTenantPlans(plans map[string]string) *TenantPlans {
	t := &TenantPlans{}
	for tenant, plan := range plans {
		if plan == "" {
			continue
		}
		s := shardOf(tenant)
		if t.shards[s] == nil {
			t.shards[s] = make(map[string]string, len(plans)/tenantShards+1)
		}
		t.shards[s][tenant] = plan
		t.n++
	}
	return t
}

func shardOf(tenant string) int { return int(maphash.String(tenantSeed, tenant) % tenantShards) }

// Plan returns tenant's plan, or "" when it has none (t may be nil).
func (t *TenantPlans) Plan(tenant string) string {
	if t == nil {
		return ""
	}
	return t.shards[shardOf(tenant)][tenant]
}

// Len is the number of tenants with a plan.
func (t *TenantPlans) Len() int {
	if t == nil {
		return 0
	}
	return t.n
}

// With returns a copy of t with changes applied: tenant to its new plan, or
// to "" when it no longer has one. t is left as it was.
func (t *TenantPlans) With(changes map[string]string) *TenantPlans {
	c := &TenantPlans{}
	if t != nil {
		*c = *t
	}
	copied := map[int]bool{}
	for tenant, plan := range changes {
		s := shardOf(tenant)
		if !copied[s] {
			copied[s] = true
			old := c.shards[s]
			c.shards[s] = make(map[string]string, len(old)+1)
			maps.Copy(c.shards[s], old)
		}
		_, had := c.shards[s][tenant]
		switch {
		case plan == "" && had:
			delete(c.shards[s], tenant)
			c.n--
		case plan != "":
			c.shards[s][tenant] = plan
			if !had {
				c.n++
			}
		}
	}
	return c
}
