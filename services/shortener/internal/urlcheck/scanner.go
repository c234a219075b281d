package urlcheck

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"kurz.dev/pkg/urlnorm"
)

// Verdict is a Scanner's answer about one destination.
type Verdict struct {
	Blocked bool
	// Why names the list or category that matched (for logs and metrics,
	// never shown to the client).
	Why string
}

// Scanner judges a destination after the syntactic checks passed: the hook
// for a Safe-Browsing-style service. u is already normalised. An error means
// the scanner could not decide; the caller refuses to store the link then.
type Scanner interface {
	Scan(ctx context.Context, u *url.URL) (Verdict, error)
}

// Blocklist is a Scanner backed by a file of domains, one per line ('#'
// starts a comment). A listed domain blocks itself and every subdomain; an IP
// literal (an IPv6 one bare or in brackets) blocks that address, an IPv4
// one in its IPv6 forms too. A line that holds more than a host (a URL,
// a path, a port) is ignored and logged. Run reloads the file when its size
// or modification time changes.
type Blocklist struct {
	path     string
	interval time.Duration
	log      *slog.Logger
	domains  atomic.Pointer[map[string]struct{}]
	stamp    fileStamp
}

type fileStamp struct {
	size int64
	mod  time.Time
}

// NewBlocklist loads path, failing if it cannot be read.
func NewBlocklist(path string, interval time.Duration, log *slog.Logger) (*Blocklist, error) {
	b := &Blocklist{path: path, interval: interval, log: log}
	if _, err := b.reload(); err != nil {
		return nil, fmt.Errorf("blocklist %s (KURZ_SHORTENER_BLOCKLIST_FILE): %w", path, err)
	}
	return b, nil
}

// Len is the number of entries loaded.
func (b *Blocklist) Len() int { return len(*b.domains.Load()) }

// Run polls the file until ctx ends. A file that disappears or cannot be read
// keeps the last good list (and is logged). changed runs on Run's goroutine
// first for the list loaded by NewBlocklist, then after every reload that
// changed it, so calls never overlap.
func (b *Blocklist) Run(ctx context.Context, changed func(context.Context)) {
	changed(ctx)
	t := time.NewTicker(b.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ok, err := b.reload()
		if err != nil {
			b.log.Warn("blocklist reload failed; keeping the previous list", "path", b.path, "err", err)
			continue
		}
		if ok {
			b.log.Info("blocklist reloaded", "path", b.path, "entries", b.Len())
			changed(ctx)
		}
	}
}

// maxEntry bounds a line worth parsing: a domain name has at most 253
// characters, and a line with a comment may have some more.
const maxEntry = 1024

func (b *Blocklist) reload() (bool, error) {
	fi, err := os.Stat(b.path)
	if err != nil {
		return false, err
	}
	stamp := fileStamp{size: fi.Size(), mod: fi.ModTime()}
	if b.domains.Load() != nil && stamp == b.stamp {
		return false, nil
	}
	data, err := os.ReadFile(b.path)
	if err != nil {
		return false, err
	}
	set := map[string]struct{}{}
	// Lines of any length: a bufio.Scanner stops at its first line over
	// 64 KiB, which silently dropped every entry after it.
	line := 0
	for text := range strings.Lines(string(data)) {
		line++
		if len(text) > maxEntry {
			b.log.Warn("blocklist: entry ignored", "path", b.path, "line", line, "err", fmt.Errorf("line of %d bytes, over %d", len(text), maxEntry))
			continue
		}
		entry, _, _ := strings.Cut(text, "#")
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		h, err := blockEntry(strings.TrimPrefix(entry, "*."))
		if err != nil {
			b.log.Warn("blocklist: entry ignored", "path", b.path, "line", line, "entry", entry, "err", err)
			continue
		}
		set[h] = struct{}{}
	}
	b.domains.Store(&set)
	b.stamp = stamp
	return true, nil
}

// blockEntry returns the normal form of a blocklist entry: a domain name or
// an IP address (an IPv6 one bare or in brackets). An entry that holds more
// than a host is refused rather than cut down to it: abuse feeds publish
// URLs, and a URL's path or a port read as its host would block, and the
// sweep would disable, every link to that whole host (a shared one such as
// sites.google.com too).
func blockEntry(s string) (string, error) {
	if strings.Contains(s, "://") {
		return "", errors.New("a URL, not a domain or IP: a path cannot be blocked on its own; list the host alone to block all of it")
	}
	if inner, ok := strings.CutPrefix(s, "["); ok { // as IPv6 is written in URLs
		inner, ok = strings.CutSuffix(inner, "]")
		if a, err := netip.ParseAddr(inner); ok && err == nil && a.Is6() && a.Zone() == "" {
			return a.Unmap().String(), nil
		}
		return "", errors.New("not an IPv6 address in brackets (a port cannot be blocked on its own; list the address alone)")
	}
	if a, err := netip.ParseAddr(s); err == nil {
		if a.Zone() != "" {
			return "", errors.New("an IPv6 address with a zone, which no URL reaches")
		}
		return a.Unmap().String(), nil
	}
	if strings.ContainsAny(s, "/?@") {
		return "", errors.New("holds a path, query or user info, not only a domain or IP: list the host alone to block all of it")
	}
	if strings.Contains(s, ":") {
		return "", errors.New("holds a port: a port cannot be blocked on its own; list the host alone to block all of it")
	}
	if a, ok := parseIPv4(s); ok && endsInNumber(s) {
		return a.String(), nil
	}
	return urlnorm.Host(s)
}

// Scan blocks the host and any parent domain found on the list. An IPv6
// host that reaches an IPv4 address (IPv4-mapped, NAT64 or 6to4) is
// blocked by that IPv4 address too, or a listed address would stay
// reachable through those forms.
func (b *Blocklist) Scan(_ context.Context, u *url.URL) (Verdict, error) {
	set := *b.domains.Load()
	h := strings.TrimSuffix(strings.TrimPrefix(u.Hostname(), "["), "]")
	if a, err := netip.ParseAddr(h); err == nil { // an address has no parent domain
		a = a.Unmap()
		listed := []netip.Addr{a}
		if v4, ok := embeddedIPv4(a); ok {
			listed = append(listed, v4)
		}
		for _, a := range listed {
			if _, ok := set[a.String()]; ok {
				return Verdict{Blocked: true, Why: "blocklist:" + a.String()}, nil
			}
		}
		return Verdict{}, nil
	}
	for {
		if _, ok := set[h]; ok {
			return Verdict{Blocked: true, Why: "blocklist:" + h}, nil
		}
		_, parent, found := strings.Cut(h, ".")
		if !found {
			return Verdict{}, nil
		}
		h = parent
	}
}

// Nothing is the Scanner used without a blocklist: it blocks nothing.
type Nothing struct{}

// Scan allows every destination.
func (Nothing) Scan(context.Context, *url.URL) (Verdict, error) { return Verdict{}, nil }
