package faults

import (
	"context"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"sync/atomic"
	"time"
)

// Balancer is an HTTP load balancer in front of replicas, as a Kubernetes
// Service with readiness probes: it polls each replica's /readyz (on its ops
// listener, as the kubelet does) and sends
// requests round-robin to the ready ones only. It does not retry: a request
// sent to a replica that fails is a failed request.
type Balancer struct {
	srv      *http.Server
	lis      net.Listener
	backends []*backend
	next     atomic.Uint64
	stop     context.CancelFunc
	wg       sync.WaitGroup
}

type backend struct {
	addr   string
	probe  string // where /readyz is
	ready  atomic.Bool
	streak atomic.Int64 // consecutive successful probes
	proxy  *httputil.ReverseProxy
}

// Replica is one replica behind a Balancer: where requests go, and where its
// /readyz is.
type Replica struct {
	Addr, ProbeAddr string
}

// NewBalancer balances over the replicas, probing every period.
func NewBalancer(replicas []Replica, period time.Duration) (*Balancer, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	b := &Balancer{lis: lis, stop: cancel}
	transport := &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 30 * time.Second}
	for _, rp := range replicas {
		be := &backend{addr: rp.Addr, probe: rp.ProbeAddr, proxy: httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: rp.Addr})}
		be.proxy.Transport = transport
		b.backends = append(b.backends, be)
		b.wg.Go(func() { b.probe(ctx, be, period) })
	}
	b.srv = &http.Server{Handler: b, ReadHeaderTimeout: 5 * time.Second}
	b.wg.Go(func() { _ = b.srv.Serve(lis) })
	return b, nil
}

// Addr is where clients send requests.
func (b *Balancer) Addr() string { return b.lis.Addr().String() }

// Ready reports whether the replica at addr is in rotation.
func (b *Balancer) Ready(addr string) bool {
	for _, be := range b.backends {
		if be.addr == addr {
			return be.ready.Load()
		}
	}
	return false
}

// Settled reports whether the replica at addr passed its last n probes in
// a row: in rotation, and staying there.
func (b *Balancer) Settled(addr string, n int) bool {
	for _, be := range b.backends {
		if be.addr == addr {
			return be.streak.Load() >= int64(n)
		}
	}
	return false
}

func (b *Balancer) probe(ctx context.Context, be *backend, period time.Duration) {
	client := &http.Client{Timeout: time.Second} // Kubernetes' default probe timeout
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		resp, err := client.Get("http://" + be.probe + "/readyz")
		ok := err == nil && resp.StatusCode == http.StatusOK
		if err == nil {
			resp.Body.Close()
		}
		be.ready.Store(ok)
		if ok {
			be.streak.Add(1)
		} else {
			be.streak.Store(0)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (b *Balancer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := uint64(len(b.backends))
	start := b.next.Add(1)
	for i := range n {
		if be := b.backends[(start+i)%n]; be.ready.Load() {
			be.proxy.ServeHTTP(w, r)
			return
		}
	}
	http.Error(w, "no ready replica", http.StatusServiceUnavailable)
}

// Close stops probing and serving.
func (b *Balancer) Close() error {
	b.stop()
	err := b.srv.Close()
	b.wg.Wait()
	return err
}
