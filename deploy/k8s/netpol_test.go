package k8s

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// peer is a traffic source as NetworkPolicy sees it.
type peer struct {
	Name      string            // for messages
	Namespace map[string]string // labels of its namespace; nil: outside the cluster
	Pod       map[string]string // labels of the pod
}

var (
	// outside is a client outside the cluster (load balancer, browser).
	outside = peer{Name: "outside the cluster"}
	// otherNamespace is a pod of some other namespace.
	otherNamespace = peer{Name: "a pod in another namespace", Namespace: map[string]string{"kubernetes.io/metadata.name": "other"}, Pod: map[string]string{"app": "x"}}
	// prometheus is the scraper in the monitoring namespace.
	prometheus = peer{Name: "prometheus", Namespace: map[string]string{"kubernetes.io/metadata.name": "monitoring"}, Pod: map[string]string{"app.kubernetes.io/name": "prometheus"}}
)

var kurzNamespace = map[string]string{"kubernetes.io/metadata.name": "kurz"}

func selects(sel *metav1.LabelSelector, set map[string]string) bool {
	if sel == nil {
		return true
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	return err == nil && s.Matches(labels.Set(set))
}

func peerMatches(np networkingv1.NetworkPolicyPeer, from peer) bool {
	if np.IPBlock != nil {
		return from.Namespace == nil // the policies here only use ipBlock for external clients
	}
	if from.Namespace == nil {
		return false // pod and namespace selectors never match external traffic
	}
	if np.NamespaceSelector == nil {
		// Same namespace as the policy.
		return from.Namespace["kubernetes.io/metadata.name"] == kurzNamespace["kubernetes.io/metadata.name"] && selects(np.PodSelector, from.Pod)
	}
	return selects(np.NamespaceSelector, from.Namespace) && selects(np.PodSelector, from.Pod)
}

func portMatches(ports []networkingv1.NetworkPolicyPort, cp corev1.ContainerPort) bool {
	if len(ports) == 0 {
		return true
	}
	for _, p := range ports {
		if p.Protocol != nil && *p.Protocol != cp.Protocol && !(cp.Protocol == "" && *p.Protocol == corev1.ProtocolTCP) {
			continue
		}
		if p.Port == nil {
			return true
		}
		if p.Port.StrVal != "" && p.Port.StrVal == cp.Name || p.Port.StrVal == "" && p.Port.IntVal == cp.ContainerPort {
			return true
		}
		if p.EndPort != nil && p.Port.StrVal == "" && cp.ContainerPort >= p.Port.IntVal && cp.ContainerPort <= *p.EndPort {
			return true
		}
	}
	return false
}

// admits evaluates ingress NetworkPolicies for traffic from a peer to one
// port of pods labelled target (all in the kurz namespace).
func admits(policies []*networkingv1.NetworkPolicy, target map[string]string, cp corev1.ContainerPort, from peer) bool {
	isolated := false
	for _, p := range policies {
		// Without policyTypes a policy always governs ingress.
		ingress := len(p.Spec.PolicyTypes) == 0 || slices.Contains(p.Spec.PolicyTypes, networkingv1.PolicyTypeIngress)
		if !ingress || !selects(&p.Spec.PodSelector, target) {
			continue
		}
		isolated = true
		for _, rule := range p.Spec.Ingress {
			if !portMatches(rule.Ports, cp) {
				continue
			}
			if len(rule.From) == 0 {
				return true
			}
			for _, np := range rule.From {
				if peerMatches(np, from) {
					return true
				}
			}
		}
	}
	return !isolated
}

// wantIngress is who may reach each workload's port in the namespace;
// "*" means everyone, including clients outside the namespace (public).
// Ports not listed are reachable by nobody in or out of the namespace
// (Prometheus aside, on the ops ports of the kurz services: see opsPort).
func wantIngress(t *testing.T, r rendering) map[string]map[string][]string {
	clients := func(envVar string) []string {
		var out []string
		for svc, vars := range readEnv(t) {
			if _, ok := vars[envVar]; ok {
				out = append(out, svc)
			}
		}
		return out
	}
	want := map[string]map[string][]string{
		"gateway":   {"http": {"*"}},
		"redirect":  {"http": {"*"}},
		"limiter":   {"grpc": {"gateway", "shortener", "redirect", "analytics"}},
		"shortener": {"grpc": {"gateway"}},
		"analytics": {"grpc": {"gateway"}},
	}
	if strings.HasPrefix(r.Dir, "overlays/dev") {
		// The stores take exactly the services whose code reads their
		// settings (from the source scan).
		want["redis"] = map[string][]string{
			"redis":       append(clients("KURZ_REDIS_ADDRS"), "redis", "redis-cluster-init", "redis-cluster-grow"),
			"cluster-bus": {"redis"},
		}
		want["postgres"] = map[string][]string{"postgres": clients("KURZ_POSTGRES_URL")}
		want["clickhouse"] = map[string][]string{"native": clients("KURZ_CLICKHOUSE_ADDRS")}
		want["otel-collector"] = map[string][]string{"otlp-grpc": clients("KURZ_OTLP_ENDPOINT")}
		// The observability stack: its Prometheus scrapes every service's
		// ops port (public http ones aside, which everyone reaches),
		// Grafana queries Prometheus and Jaeger, the collector exports to
		// Jaeger. The UIs are for port forwards only.
		for _, svc := range services {
			if ops := opsPort(svc); !slices.Contains(want[svc][ops], "*") {
				want[svc][ops] = append(want[svc][ops], "prometheus")
			}
		}
		want["prometheus"] = map[string][]string{"http": {"grafana"}}
		want["jaeger"] = map[string][]string{"otlp-grpc": {"otel-collector"}, "http": {"grafana"}}
	}
	if r.Dir == "overlays/dev-chcluster" {
		// The nodes query and replicate from each other, through Keeper.
		want["clickhouse"]["native"] = append(want["clickhouse"]["native"], "clickhouse")
		want["clickhouse"]["interserver"] = []string{"clickhouse"}
		want["clickhouse-keeper"] = map[string][]string{"keeper": {"clickhouse"}}
	}
	return want
}

func TestNetworkPolicies(t *testing.T) {
	for _, dir := range overlays {
		t.Run(strings.ReplaceAll(dir, "/", "_"), func(t *testing.T) {
			r := render(t, dir)
			checkNetworkPolicies(t, r, wantIngress(t, r))
		})
	}
}

// checkNetworkPolicies fails t unless the rendering has a default-deny
// ingress policy and its policies admit to each workload's ports exactly
// the peers of want (wantIngress), Prometheus to the kurz services' ops
// ports, and nothing from outside the namespace but the public ports.
func checkNetworkPolicies(t *testing.T, r rendering, want map[string]map[string][]string) {
	t.Helper()
	policies := typed[networkingv1.NetworkPolicy](r)
	defaultDeny := false
	for _, p := range policies {
		if len(p.Spec.PodSelector.MatchLabels)+len(p.Spec.PodSelector.MatchExpressions) == 0 &&
			slices.Contains(p.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) && len(p.Spec.Ingress) == 0 {
			defaultDeny = true
		}
	}
	if !defaultDeny {
		t.Error("no default-deny ingress policy (empty podSelector, policyTypes [Ingress], no rules)")
	}
	ws := workloads(r)
	var inNamespace []peer
	for _, w := range ws {
		inNamespace = append(inNamespace, peer{Name: w.app(), Namespace: kurzNamespace, Pod: w.Template.Labels})
	}
	var public []string
	for _, w := range ws {
		for _, c := range w.Template.Spec.Containers {
			for _, cp := range c.Ports {
				var got []string
				for _, from := range inNamespace {
					if admits(policies, w.Template.Labels, cp, from) && !slices.Contains(got, from.Name) {
						got = append(got, from.Name)
					}
				}
				external := admits(policies, w.Template.Labels, cp, outside) || admits(policies, w.Template.Labels, cp, otherNamespace)
				if external {
					public = append(public, fmt.Sprintf("%s:%s", w.app(), cp.Name))
					got = []string{"*"}
				}
				expected := slices.Clone(want[w.app()][cp.Name])
				sort.Strings(got)
				sort.Strings(expected)
				if !slices.Equal(got, expected) {
					t.Errorf("%s port %s is reachable from %v, want %v", w.app(), cp.Name, got, expected)
				}
				scrapable := admits(policies, w.Template.Labels, cp, prometheus)
				wantScrape := kurzService(w) != "" && cp.Name == opsPort(kurzService(w))
				if scrapable != wantScrape && !external {
					t.Errorf("%s port %s: Prometheus may scrape it: %v, want %v", w.app(), cp.Name, scrapable, wantScrape)
				}
			}
		}
	}
	sort.Strings(public)
	if strings.Join(public, ",") != "gateway:http,redirect:http" {
		t.Errorf("ports reachable from outside the namespace: %v, want [gateway:http redirect:http]", public)
	}
}

func TestNetworkPolicyEvaluator(t *testing.T) {
	tcp := corev1.ProtocolTCP
	deny := &networkingv1.NetworkPolicy{Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
	allowGateway := &networkingv1.NetworkPolicy{Spec: networkingv1.NetworkPolicySpec{
		PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": "limiter"}},
		PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
		Ingress: []networkingv1.NetworkPolicyIngressRule{{
			From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": "gateway"}}}},
			Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &intstr.IntOrString{Type: intstr.String, StrVal: "grpc"}}},
		}},
	}}
	limiter := map[string]string{"app.kubernetes.io/name": "limiter"}
	grpc := corev1.ContainerPort{Name: "grpc", ContainerPort: 9091, Protocol: tcp}
	http := corev1.ContainerPort{Name: "http", ContainerPort: 9191, Protocol: tcp}
	gateway := peer{Name: "gateway", Namespace: kurzNamespace, Pod: map[string]string{"app.kubernetes.io/name": "gateway"}}
	redirect := peer{Name: "redirect", Namespace: kurzNamespace, Pod: map[string]string{"app.kubernetes.io/name": "redirect"}}
	cases := []struct {
		name     string
		policies []*networkingv1.NetworkPolicy
		port     corev1.ContainerPort
		from     peer
		want     bool
	}{
		{"no policy admits all", nil, grpc, outside, true},
		{"default deny", []*networkingv1.NetworkPolicy{deny}, grpc, gateway, false},
		{"allowed caller", []*networkingv1.NetworkPolicy{deny, allowGateway}, grpc, gateway, true},
		{"other caller", []*networkingv1.NetworkPolicy{deny, allowGateway}, grpc, redirect, false},
		{"other port", []*networkingv1.NetworkPolicy{deny, allowGateway}, http, gateway, false},
		{"same labels in another namespace", []*networkingv1.NetworkPolicy{deny, allowGateway}, grpc, peer{Name: "x", Namespace: otherNamespace.Namespace, Pod: gateway.Pod}, false},
		{"outside", []*networkingv1.NetworkPolicy{deny, allowGateway}, grpc, outside, false},
	}
	for _, tc := range cases {
		if got := admits(tc.policies, limiter, tc.port, tc.from); got != tc.want {
			t.Errorf("%s: admits = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// egressAllows evaluates egress NetworkPolicies for traffic from pods
// labelled source to the address ip outside the cluster (any port).
func egressAllows(policies []*networkingv1.NetworkPolicy, source map[string]string, ip netip.Addr) bool {
	isolated := false
	for _, p := range policies {
		if !slices.Contains(p.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) || !selects(&p.Spec.PodSelector, source) {
			continue
		}
		isolated = true
		for _, rule := range p.Spec.Egress {
			if len(rule.To) == 0 {
				return true
			}
			for _, to := range rule.To {
				if to.IPBlock != nil && inBlock(to.IPBlock, ip) {
					return true
				}
			}
		}
	}
	return !isolated
}

// inBlock reports whether ip is in b's CIDR and none of its exceptions.
func inBlock(b *networkingv1.IPBlock, ip netip.Addr) bool {
	if p, err := netip.ParsePrefix(b.CIDR); err != nil || !p.Contains(ip) {
		return false
	}
	for _, e := range b.Except {
		if p, err := netip.ParsePrefix(e); err == nil && p.Contains(ip) {
			return false
		}
	}
	return true
}

// No pod of any overlay reaches the clouds' instance metadata, which hands
// out the node's credentials; every pod still reaches addresses outside
// the cluster (the managed stores, webhook receivers).
func TestNoPodReachesInstanceMetadata(t *testing.T) {
	metadata := []string{"169.254.169.254", "fd00:ec2::254"}
	elsewhere := []string{"10.0.0.5", "203.0.113.7", "2001:db8::1", "169.254.20.10"} // the last: NodeLocal DNSCache
	for _, dir := range overlays {
		t.Run(strings.ReplaceAll(dir, "/", "_"), func(t *testing.T) {
			r := render(t, dir)
			policies := typed[networkingv1.NetworkPolicy](r)
			for _, w := range workloads(r) {
				for _, a := range metadata {
					if egressAllows(policies, w.Template.Labels, netip.MustParseAddr(a)) {
						t.Errorf("%s may reach the instance metadata at %s", w.app(), a)
					}
				}
				for _, a := range elsewhere {
					if !egressAllows(policies, w.Template.Labels, netip.MustParseAddr(a)) {
						t.Errorf("%s may not reach %s", w.app(), a)
					}
				}
			}
		})
	}
}
