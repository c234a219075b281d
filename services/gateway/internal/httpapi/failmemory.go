package httpapi

import (
	"container/list"
	"sync"
	"time"
)

// failMemory remembers which client IPs failed to authenticate recently, so
// the brute-force rule can stay closed for them while the limiter cannot
// answer. It is bounded: past capacity the IP whose last failure is oldest
// is forgotten first.
type failMemory struct {
	mu       sync.Mutex
	ttl      time.Duration
	capacity int
	now      func() time.Time
	order    *list.List // of *failEntry, least recent failure first
	byIP     map[string]*list.Element
}

type failEntry struct {
	ip   string
	last time.Time
}

func newFailMemory(capacity int, ttl time.Duration, now func() time.Time) *failMemory {
	return &failMemory{ttl: ttl, capacity: capacity, now: now, order: list.New(), byIP: map[string]*list.Element{}}
}

// setTTL changes how long a failure is remembered (the rule's window, once
// the limiter has told it).
func (m *failMemory) setTTL(ttl time.Duration) {
	if ttl <= 0 {
		return
	}
	m.mu.Lock()
	m.ttl = ttl
	m.mu.Unlock()
}

// add records a failure of ip now.
func (m *failMemory) add(ip string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	if el, ok := m.byIP[ip]; ok {
		el.Value.(*failEntry).last = now
		m.order.MoveToBack(el)
		return
	}
	m.expire(now)
	for m.order.Len() >= m.capacity {
		m.remove(m.order.Front())
	}
	m.byIP[ip] = m.order.PushBack(&failEntry{ip: ip, last: now})
}

// recent reports whether ip failed within the TTL, and until when it is
// remembered.
func (m *failMemory) recent(ip string) (time.Time, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	el, ok := m.byIP[ip]
	if !ok {
		return time.Time{}, false
	}
	until := el.Value.(*failEntry).last.Add(m.ttl)
	if !m.now().Before(until) {
		m.remove(el)
		return time.Time{}, false
	}
	return until, true
}

// len is how many IPs are remembered (expired ones may still count).
func (m *failMemory) len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.order.Len()
}

// expire drops the entries whose last failure is older than the TTL; they
// sit at the front.
func (m *failMemory) expire(now time.Time) {
	for el := m.order.Front(); el != nil; el = m.order.Front() {
		if now.Before(el.Value.(*failEntry).last.Add(m.ttl)) {
			return
		}
		m.remove(el)
	}
}

func (m *failMemory) remove(el *list.Element) {
	delete(m.byIP, el.Value.(*failEntry).ip)
	m.order.Remove(el)
}
