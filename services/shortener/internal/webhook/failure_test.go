package webhook

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"kurz.dev/pkg/webhooksig"
)

// internal are the details of our side that the constructed errors carry:
// the resolver's address, the shortener's own address and port, a name of
// the cluster. None may reach the tenant.
var internal = []string{"10.255.255.53", ":53", "10.1.2.3", "40000", "kurz.svc.cluster.local", "dial tcp", "lookup hooks", "connect:"}

func dialErr(err error) error {
	return &net.OpError{Op: "dial", Net: "tcp",
		Source: &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 40000},
		Addr:   &net.TCPAddr{IP: net.IPv4(203, 0, 113, 7), Port: 443}, Err: err}
}

func dnsErr(e net.DNSError) error {
	e.Name, e.Server = "hooks.example.com.kurz.svc.cluster.local", "10.255.255.53:53"
	return &net.OpError{Op: "dial", Net: "tcp", Err: &e}
}

// TestFailureShowsTheTenantNoInternalDetail: whatever the transport
// returned, the tenant's last_error is a fixed sentence (naming at most the
// host it subscribed), never the error's text with our resolver or our
// addresses in it.
func TestFailureShowsTheTenantNoInternalDetail(t *testing.T) {
	s := &Sender{cfg: Config{Timeout: 10 * time.Second}}
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"refused at dial", dialErr(fmt.Errorf("%w: 10.1.2.3 is not a public address", errNotAllowed)),
			"refused: the receiver resolves to a non-public address"},
		{"no such host", dnsErr(net.DNSError{Err: "no such host", IsNotFound: true}),
			"DNS lookup failed for hooks.example.com: no such host"},
		{"dns timeout", dnsErr(net.DNSError{Err: "i/o timeout", IsTimeout: true}), "DNS lookup timed out for hooks.example.com"},
		{"dns failure", dnsErr(net.DNSError{Err: "server misbehaving", IsTemporary: true}), "DNS lookup failed for hooks.example.com"},
		{"refused", dialErr(os.NewSyscallError("connect", syscall.ECONNREFUSED)), "connection refused"},
		{"no route", dialErr(os.NewSyscallError("connect", syscall.EHOSTUNREACH)), "no route to the receiver"},
		{"network unreachable", dialErr(os.NewSyscallError("connect", syscall.ENETUNREACH)), "no route to the receiver"},
		{"connect timed out", dialErr(os.NewSyscallError("connect", syscall.ETIMEDOUT)), "connection timed out"},
		{"dial deadline", dialErr(os.ErrDeadlineExceeded), "connection timed out"},
		{"no answer", context.DeadlineExceeded, "no answer within 10s"},
		{"plain http", http.ErrSchemeMismatch, "TLS handshake failed: the receiver answered in plain HTTP"},
		{"wrong name", &tls.CertificateVerificationError{Err: x509.HostnameError{
			Certificate: &x509.Certificate{DNSNames: []string{"gw.kurz.svc.cluster.local"}}, Host: "10.1.2.3"}},
			"TLS handshake failed: the certificate is not valid for hooks.example.com"},
		{"unknown authority", &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}},
			"TLS handshake failed: the certificate is signed by an unknown authority"},
		{"expired", &tls.CertificateVerificationError{Err: x509.CertificateInvalidError{Reason: x509.Expired, Detail: "at 10.1.2.3:40000"}},
			"TLS handshake failed: the certificate has expired or is not yet valid"},
		{"bad certificate", x509.CertificateInvalidError{Reason: x509.NotAuthorizedToSign}, "TLS handshake failed: the certificate is not valid"},
		{"alert received", &net.OpError{Op: "remote error", Err: tls.AlertError(40)}, "TLS handshake failed"},
		{"not tls", tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}, "TLS handshake failed"},
		{"reset", &net.OpError{Op: "read", Net: "tcp", Source: &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 40000},
			Err: os.NewSyscallError("read", syscall.ECONNRESET)}, "the receiver reset the connection"},
		{"closed", io.EOF, "the receiver closed the connection without an answer"},
		{"anything else", errors.New("net/http: something on 10.1.2.3:40000 via 10.255.255.53:53"), "request failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// As the client returns it: wrapped in a *url.Error naming the URL.
			err := &url.Error{Op: "Post", URL: "https://hooks.example.com/kurz?token=x", Err: tc.err}
			got := s.failure(err, "hooks.example.com")
			if got != tc.want {
				t.Errorf("failure(%v) = %q, want %q", err, got, tc.want)
			}
			for _, d := range internal {
				if strings.Contains(got, d) {
					t.Errorf("failure(%v) = %q shows the tenant %q", err, got, d)
				}
			}
		})
	}
}

// TestAttemptRecordsNoInternalDetail sends real attempts to receivers that
// fail in the usual ways and checks what the tenant would read.
func TestAttemptRecordsNoInternalDetail(t *testing.T) {
	refusedAddr := func() string { // a loopback port nothing listens on
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		return addr
	}()
	hangUp, err := net.Listen("tcp", "127.0.0.1:0") // reads the request, closes without answering
	if err != nil {
		t.Fatal(err)
	}
	defer hangUp.Close()
	go func() {
		for {
			c, err := hangUp.Accept()
			if err != nil {
				return
			}
			_, _ = c.Read(make([]byte, 4096))
			c.Close()
		}
	}()
	plain := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer plain.Close()
	untrusted := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	untrusted.Config.ErrorLog = log.New(io.Discard, "", 0) // its handshakes fail on purpose
	untrusted.StartTLS()
	defer untrusted.Close()

	sealer, _ := NewSealer(strings.Repeat("k", 32), "")
	targets := Targets{AllowHTTP: true, Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}}
	s := &Sender{cfg: Config{Timeout: 2 * time.Second}, sealer: sealer, client: targets.Client(2 * time.Second), allowHTTP: true, now: time.Now}
	for _, tc := range []struct{ url, want string }{
		{"https://receiver.invalid/kurz", "DNS lookup failed for receiver.invalid: no such host"},
		{"http://" + refusedAddr + "/kurz", "connection refused"},
		{"http://" + hangUp.Addr().String() + "/kurz", "the receiver closed the connection without an answer"},
		{strings.Replace(plain.URL, "http:", "https:", 1) + "/kurz", "TLS handshake failed: the receiver answered in plain HTTP"},
		{untrusted.URL + "/kurz", "TLS handshake failed: the certificate is signed by an unknown authority"},
		{"http://[::1]:1/kurz", "refused: the receiver resolves to a non-public address"}, // not allow-listed
	} {
		c := claim{Delivery: Delivery{ID: "evt_1", SubscriptionID: "wh_1", EventType: "link.created", Data: []byte(`{}`)},
			URL: tc.url, Sealed: sealer.Seal("wh_1", newSecret())}
		o := s.attempt(context.Background(), c)
		if o.err != tc.want {
			t.Errorf("%s: last error %q, want %q (raw: %v)", tc.url, o.err, tc.want, o.cause)
		}
		if o.cause == nil {
			t.Errorf("%s: no raw error kept for the log", tc.url)
		}
		hidden := []string{"lookup receiver", "dial tcp", "127.0.0.1", "[::1]"}
		if de := (*net.DNSError)(nil); errors.As(o.cause, &de) {
			hidden = append(hidden, de.Server) // our resolver
		}
		for _, d := range hidden {
			if strings.Contains(o.err, d) {
				t.Errorf("%s: last error %q shows the tenant %q", tc.url, o.err, d)
			}
		}
	}
}

// A receiver that answers 101 Switching Protocols gets the connection as
// the answer's body, which no client timeout bounds: the attempt fails at
// once instead of reading it for as long as the receiver keeps it open.
func TestAttemptDoesNotReadAnUpgradedConnection(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	held := make(chan net.Conn, 1)
	t.Cleanup(func() {
		l.Close()
		select {
		case c := <-held:
			c.Close()
		default:
		}
	})
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		_, _ = c.Read(make([]byte, 4096))
		_, _ = c.Write([]byte("HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: Upgrade\r\n\r\n"))
		held <- c // open until the test ends
	}()
	sealer, _ := NewSealer(strings.Repeat("k", 32), "")
	targets := Targets{AllowHTTP: true, Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}}
	s := &Sender{cfg: Config{Timeout: time.Second}, sealer: sealer, client: targets.Client(time.Second), allowHTTP: true, now: time.Now}
	c := claim{Delivery: Delivery{ID: "evt_1", SubscriptionID: "wh_1", EventType: "link.created", Data: []byte(`{}`)},
		URL: "http://" + l.Addr().String() + "/kurz", Sealed: sealer.Seal("wh_1", newSecret())}
	done := make(chan outcome, 1)
	go func() { done <- s.attempt(context.Background(), c) }()
	select {
	case o := <-done:
		if o.status != http.StatusSwitchingProtocols || !strings.Contains(o.err, "must answer 2xx") {
			t.Errorf("outcome %+v, want a failed attempt with status 101", o)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the attempt was still reading the upgraded connection after 30 s (timeout 1 s)")
	}
}

// A subscription to a plain http:// receiver, made while http was allowed,
// is not sent to once it is not: the attempt fails for good, unsent.
func TestAttemptSendsOverHTTPSOnlyUnlessAllowed(t *testing.T) {
	reached := make(chan struct{}, 1)
	plain := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { reached <- struct{}{} }))
	defer plain.Close()
	sealer, _ := NewSealer(strings.Repeat("k", 32), "")
	targets := Targets{Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}}
	s := &Sender{cfg: Config{Timeout: time.Second}, sealer: sealer, client: targets.Client(time.Second), now: time.Now}
	c := claim{Delivery: Delivery{ID: "evt_1", SubscriptionID: "wh_1", EventType: "link.created", Data: []byte(`{}`)},
		URL: plain.URL + "/kurz", Sealed: sealer.Seal("wh_1", newSecret())}
	if o := s.attempt(context.Background(), c); !o.dead || !strings.Contains(o.err, "not https") {
		t.Errorf("outcome %+v, want dead: not https", o)
	}
	select {
	case <-reached:
		t.Error("the plain http receiver got the delivery")
	default:
	}
}

// During a key rotation a delivery of a subscription whose secret the
// previous key sealed is signed with that secret, not dead.
func TestAttemptSignsWithASecretOfThePreviousKey(t *testing.T) {
	oldKey := strings.Repeat("o", 32)
	old, _ := NewSealer(oldKey, "")
	rotating, _ := NewSealer(strings.Repeat("n", 32), oldKey)
	secret := newSecret()
	verified := make(chan error, 1)
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		verified <- webhooksig.Verify(secret, r.Header.Get(webhooksig.Header), b, time.Now(), 0)
	}))
	defer rc.Close()
	targets := Targets{AllowHTTP: true, Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}}
	s := &Sender{cfg: Config{Timeout: 2 * time.Second}, sealer: rotating, client: targets.Client(2 * time.Second), allowHTTP: true, now: time.Now}
	c := claim{Delivery: Delivery{ID: "evt_1", SubscriptionID: "wh_1", EventType: "link.created", Data: []byte(`{}`)},
		URL: rc.URL + "/kurz", Sealed: old.Seal("wh_1", secret)}
	if o := s.attempt(context.Background(), c); o.err != "" || o.dead {
		t.Fatalf("attempt: %q (dead %v), want it delivered", o.err, o.dead)
	}
	if err := <-verified; err != nil {
		t.Errorf("the receiver could not verify the delivery with its secret: %v", err)
	}
}
