package linkapi_test

import (
	"context"
	"net/url"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/linkcache"
	"kurz.dev/services/shortener/internal/linkapi"
	"kurz.dev/services/shortener/internal/urlcheck"
)

// blocker is a scanner whose list the test changes: a host blocks itself
// and its subdomains, as the blocklist file does.
type blocker struct {
	mu    sync.Mutex
	hosts []string
}

func (b *blocker) block(host string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.hosts = append(b.hosts, host)
}

func (b *blocker) Scan(_ context.Context, u *url.URL) (urlcheck.Verdict, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, h := range b.hosts {
		if u.Hostname() == h || strings.HasSuffix(u.Hostname(), "."+h) {
			return urlcheck.Verdict{Blocked: true, Why: "test:" + h}, nil
		}
	}
	return urlcheck.Verdict{}, nil
}

// A link the blocklist sweep disabled cannot be enabled again while one of
// the destinations it would serve is blocked, whichever kind it is (long
// URL, device target, rule, variant) and though the update does not touch
// it: the update is refused URL_BLOCKED naming the field, and the link stays
// disabled in the store and gone in the cache. Destinations the same update
// replaces count with their new value.
func TestEnablingASweptLinkRescansItsDestinations(t *testing.T) {
	const bad = "bad.example"
	ios := &shortenerv1.DeviceTargets{IosUrl: "https://" + bad + "/ios"}
	rule := []*shortenerv1.RedirectRule{{Name: "r", Url: "https://" + bad + "/rule",
		Conditions: []*shortenerv1.RuleCondition{{Devices: []string{"ios"}}}}}
	variant := []*shortenerv1.Variant{{Name: "v", Url: "https://" + bad + "/variant", Weight: 1}}
	for name, c := range map[string]struct {
		create *shortenerv1.CreateLinkRequest
		// enable is the update besides disabled: false, and its mask.
		enable *shortenerv1.Link
		paths  []string
		// field is the one refused; empty: the link is enabled.
		field string
	}{
		"long url": {create: &shortenerv1.CreateLinkRequest{LongUrl: "https://login." + bad + "/x"},
			field: "long_url"},
		"device target": {create: &shortenerv1.CreateLinkRequest{LongUrl: "https://fine.example/a", DeviceTargets: ios},
			field: "device_targets.ios_url"},
		"rule": {create: &shortenerv1.CreateLinkRequest{LongUrl: "https://fine.example/b", Rules: rule},
			field: "rules[0].url"},
		"variant": {create: &shortenerv1.CreateLinkRequest{LongUrl: "https://fine.example/c", Variants: variant},
			field: "variants[0].url"},
		"kept target, new long url": {create: &shortenerv1.CreateLinkRequest{LongUrl: "https://fine.example/d", DeviceTargets: ios},
			enable: &shortenerv1.Link{LongUrl: "https://fine.example/new"}, paths: []string{"long_url"},
			field: "device_targets.ios_url"},
		"kept variant, new rules": {create: &shortenerv1.CreateLinkRequest{LongUrl: "https://fine.example/e", Rules: rule, Variants: variant},
			enable: &shortenerv1.Link{}, paths: []string{"rules"}, field: "variants[0].url"},
		"blocked long url replaced": {create: &shortenerv1.CreateLinkRequest{LongUrl: "https://login." + bad + "/y"},
			enable: &shortenerv1.Link{LongUrl: "https://fine.example/instead"}, paths: []string{"long_url"}},
		"blocked target cleared": {create: &shortenerv1.CreateLinkRequest{LongUrl: "https://fine.example/f", DeviceTargets: ios},
			enable: &shortenerv1.Link{}, paths: []string{"device_targets"}},
	} {
		t.Run(name, func(t *testing.T) {
			scanner := &blocker{}
			e := newEnvWith(t, func(d *linkapi.Deps) { d.Scanner = scanner })
			ctx := as("acme")
			made, err := e.client.CreateLink(ctx, c.create)
			if err != nil {
				t.Fatal(err)
			}
			code := made.GetLink().GetCode()
			scanner.block(bad)
			rep, err := e.svc.SweepBlocked(t.Context())
			if err != nil || len(rep.Disabled) != 1 || rep.Disabled[0].Code != code {
				t.Fatalf("sweep: %+v, %v; want %s disabled", rep, err, code)
			}

			enable := &shortenerv1.Link{}
			if c.enable != nil {
				enable = c.enable
			}
			enable.Code, enable.Disabled = code, false
			got, err := e.client.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{Link: enable, UpdateMask: mask(append(c.paths, "disabled")...)})
			if c.field == "" {
				if err != nil || got.GetLink().GetDisabled() {
					t.Fatalf("enable with the blocked destination replaced: %v, %v; want the link enabled", got.GetLink(), err)
				}
				if entry, _ := e.cache.entry(t, code); entry.State != linkcache.Active {
					t.Errorf("cache entry %+v, want active", entry)
				}
				return
			}
			wantStatus(t, "enable", err, codes.InvalidArgument, urlcheck.ReasonBlocked, c.field)
			l, err := e.client.GetLink(ctx, &shortenerv1.GetLinkRequest{Code: code})
			if err != nil || !l.GetLink().GetDisabled() || l.GetLink().GetLongUrl() != made.GetLink().GetLongUrl() {
				t.Errorf("after the refused update: %v, %v; want the link unchanged, disabled", l.GetLink(), err)
			}
			if entry, found := e.cache.entry(t, code); !found || entry.State != linkcache.Gone {
				t.Errorf("cache entry %+v (found %v), want gone", entry, found)
			}
		})
	}
}

// A link the tenant disabled whose destinations are not blocked is enabled
// again as before.
func TestEnablingALinkWithFineDestinations(t *testing.T) {
	scanner := &blocker{}
	e := newEnvWith(t, func(d *linkapi.Deps) { d.Scanner = scanner })
	scanner.block("bad.example")
	ctx := as("acme")
	made, err := e.client.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://fine.example/x",
		DeviceTargets: &shortenerv1.DeviceTargets{AndroidUrl: "https://fine.example/android"}})
	if err != nil {
		t.Fatal(err)
	}
	code := made.GetLink().GetCode()
	for _, disabled := range []bool{true, false} {
		got, err := e.client.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{Link: &shortenerv1.Link{Code: code, Disabled: disabled}, UpdateMask: mask("disabled")})
		if err != nil || got.GetLink().GetDisabled() != disabled {
			t.Fatalf("disabled %v: %v, %v", disabled, got.GetLink(), err)
		}
	}
	if entry, _ := e.cache.entry(t, code); entry.State != linkcache.Active {
		t.Errorf("cache entry %+v, want active", entry)
	}
}
