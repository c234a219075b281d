package webhook

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
	"time"

	"kurz.dev/pkg/urlnorm"
	"kurz.dev/services/shortener/internal/urlcheck"
)

// maxURLLength bounds a receiver URL.
const maxURLLength = 2048

// Targets decides which receivers kurz may call: https (http only with
// AllowHTTP), and only public addresses, or ones in an allow-listed range.
// The address check runs on the resolved IP at dial time, so a name that
// resolves to a public address when subscribed and a private one later
// (DNS rebinding) is refused all the same.
type Targets struct {
	AllowHTTP bool
	Allow     []netip.Prefix
}

// errNotAllowed marks a refused address.
var errNotAllowed = errors.New("address not allowed")

// allowed reports whether kurz may connect to a.
func (t Targets) allowed(a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range t.Allow {
		if p.Contains(a) {
			return true
		}
	}
	return urlcheck.PublicIP(a)
}

// localNames reports whether receivers may be local names (localhost, one
// label): only where loopback is allow-listed, for development.
func (t Targets) localNames() bool { return t.allowed(netip.MustParseAddr("127.0.0.1")) }

// Check validates a receiver URL when it is subscribed and returns it
// normalised; the problem is a sentence for the caller.
func (t Targets) Check(raw string) (string, error) {
	if raw == "" {
		return "", errors.New("url is required")
	}
	if len(raw) > maxURLLength {
		return "", fmt.Errorf("url is longer than %d characters", maxURLLength)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "", errors.New("url is not a URL")
	}
	switch {
	case u.Scheme == "https":
	case u.Scheme == "http" && t.AllowHTTP:
	case u.Scheme == "http":
		return "", errors.New("url must be https (this server does not allow http receivers)")
	default:
		return "", errors.New("url must be an https URL")
	}
	if u.User != nil {
		return "", errors.New("url must not carry a user name or password")
	}
	if u.Fragment != "" || u.Opaque != "" {
		return "", errors.New("url must not have a fragment")
	}
	host := u.Hostname()
	if host == "" {
		return "", errors.New("url has no host")
	}
	// A port out of range was subscribed, and every delivery failed to
	// dial it: refused here, and written as the sender will dial it.
	if u.Port() != "" {
		port, err := urlcheck.Port(u.Scheme, u.Port())
		if err != nil {
			return "", errors.New("url's port must be a number from 1 to 65535")
		}
		if u.Host = host; strings.Contains(host, ":") {
			u.Host = "[" + host + "]"
		}
		if port != "" {
			u.Host += ":" + port
		}
	}
	a, err := netip.ParseAddr(strings.Trim(host, "[]"))
	if err != nil {
		// Hosts such as 127.1, 0x7f.1 or 2130706433 are IPv4 addresses to a
		// browser but names to the resolver, which fails on them: judge
		// the address and subscribe its dotted form.
		var numeric, ok bool
		if a, numeric, ok = urlcheck.ParseHostIPv4(host); numeric && !ok {
			return "", errors.New("url's host is neither a domain name nor a valid IPv4 address")
		}
		if numeric {
			port := u.Port()
			u.Host = a.String()
			if port != "" {
				u.Host += ":" + port
			}
		}
	}
	if !a.IsValid() && !t.localNames() {
		// A name as the resolver will see it (punycode, lower case): a
		// Unicode look-alike of a local name is that name. One label
		// is an intranet name (or one the resolver's search domains
		// complete): a tenant could learn which exist from the
		// deliveries' errors.
		ascii, err := urlnorm.Host(host)
		// IDNA maps a full-width or ideographic full stop to "." after
		// Host trimmed the ASCII one: "vm\uff0e" is "vm.", one label.
		ascii = strings.TrimSuffix(ascii, ".")
		switch {
		case err != nil:
			return "", errors.New("url's host is not a valid domain name")
		case urlcheck.LocalName(ascii):
			return "", errors.New("url names a local host")
		case !strings.Contains(ascii, "."):
			return "", errors.New("url's host must be a fully qualified domain name")
		}
		if port := u.Port(); port != "" {
			ascii += ":" + port
		}
		u.Host = ascii
	}
	if a.IsValid() && !t.allowed(a) {
		return "", errors.New("url points to a private, loopback, link-local or otherwise non-public address")
	}
	return u.String(), nil
}

// Client returns the HTTP client deliveries go through: no proxy (it would
// hide the address dialled), every dialled address checked, redirects not
// followed, each attempt bounded by timeout.
func (t Targets) Client(timeout time.Duration) *http.Client {
	local := t.localNames()
	d := &net.Dialer{
		Timeout: timeout,
		Control: func(_, address string, _ syscall.RawConn) error {
			host, _, err := net.SplitHostPort(address)
			if err != nil {
				return err
			}
			a, err := netip.ParseAddr(host)
			if err != nil || !t.allowed(a) {
				return fmt.Errorf("%w: %s is not a public address", errNotAllowed, host)
			}
			return nil
		},
	}
	tr := &http.Transport{
		Proxy: nil,
		// Names of several labels resolve as absolute (a trailing dot):
		// the resolver's search domains (a cluster's svc.cluster.local)
		// never complete them into internal names. (Check refuses names
		// of one label but in development.) TLS and Host use the URL's.
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if host, port, err := net.SplitHostPort(addr); err == nil {
				if _, err := netip.ParseAddr(host); err != nil {
					name := strings.TrimSuffix(host, ".")
					if !strings.Contains(name, ".") && !local {
						// Subscribed before Check refused one label.
						return nil, fmt.Errorf("%w: %s is not a fully qualified name", errNotAllowed, host)
					}
					if strings.Contains(name, ".") {
						addr = net.JoinHostPort(name+".", port)
					}
				}
			}
			return d.DialContext(ctx, network, addr)
		},
		TLSHandshakeTimeout:    timeout,
		ResponseHeaderTimeout:  timeout,
		MaxIdleConns:           64,
		MaxIdleConnsPerHost:    4,
		IdleConnTimeout:        90 * time.Second,
		MaxResponseHeaderBytes: 16 << 10,
	}
	return &http.Client{
		Transport: tr,
		Timeout:   timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}

// dialRefused reports whether err is a refused address.
func dialRefused(err error) bool { return errors.Is(err, errNotAllowed) }

// timedOut reports whether err is a timeout.
func timedOut(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}
