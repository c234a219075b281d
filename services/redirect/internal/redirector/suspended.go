package redirector

import "sync/atomic"

// Suspended is the set of tenants an administrator suspended (the gateway's
// POST /v1/admin/tenants/{tenant}/suspend, the shortener's
// tenant_suspensions table): their links answer 410 like a disabled link.
// A loader replaces the set as a whole every few seconds (Set), so a
// request never waits on a store to learn it: the check is one atomic load
// and one map lookup of the cached entry's tenant, on every tier (L1
// included), without a lock for requests to contend on.
//
// A nil *Suspended holds no tenant, and so does one never Set (Loaded
// reports which).
type Suspended struct {
	tenants atomic.Pointer[map[string]struct{}]
}

// Set replaces the suspended tenants. The map must not change afterwards.
func (s *Suspended) Set(tenants map[string]struct{}) {
	s.tenants.Store(&tenants)
}

// Has reports whether tenant is suspended.
func (s *Suspended) Has(tenant string) bool {
	if s == nil {
		return false
	}
	m := s.tenants.Load()
	if m == nil {
		return false
	}
	_, ok := (*m)[tenant]
	return ok
}

// Len returns how many tenants are suspended.
func (s *Suspended) Len() int {
	if s == nil {
		return 0
	}
	if m := s.tenants.Load(); m != nil {
		return len(*m)
	}
	return 0
}

// Loaded reports whether the set was Set at least once.
func (s *Suspended) Loaded() bool { return s != nil && s.tenants.Load() != nil }
