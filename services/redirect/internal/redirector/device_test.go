package redirector

import (
	"testing"

	"kurz.dev/pkg/linkcache"
)

// User-Agents of each class, as browsers and in-app web views send them.
var userAgents = map[string]struct {
	ua   string
	want Device
}{
	"safari on iphone":      {"Mozilla/5.0 (iPhone; CPU iPhone OS 17_4 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.4 Mobile/15E148 Safari/604.1", IOS},
	"chrome on iphone":      {"Mozilla/5.0 (iPhone; CPU iPhone OS 17_4 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) CriOS/124.0.6367.88 Mobile/15E148 Safari/604.1", IOS},
	"ipad in mobile mode":   {"Mozilla/5.0 (iPad; CPU OS 17_4 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.4 Mobile/15E148 Safari/604.1", IOS},
	"ipod touch":            {"Mozilla/5.0 (iPod touch; CPU iPhone OS 15_7 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/15.6 Mobile/15E148 Safari/604.1", IOS},
	"instagram in-app":      {"Mozilla/5.0 (iPhone; CPU iPhone OS 17_4 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Mobile/15E148 Instagram 327.0.0.0", IOS},
	"chrome on android":     {"Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.6367.82 Mobile Safari/537.36", Android},
	"android tablet":        {"Mozilla/5.0 (Linux; Android 13; SM-X710) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 Safari/537.36", Android},
	"android web view":      {"Mozilla/5.0 (Linux; Android 12; SM-G991B Build/SP1A.210812.016; wv) AppleWebKit/537.36 (KHTML, like Gecko) Version/4.0 Chrome/124.0.0.0 Mobile Safari/537.36", Android},
	"ipados safari desktop": {"Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.4 Safari/605.1.15", Desktop},
	"chrome on windows":     {"Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 Safari/537.36", Desktop},
	"firefox on linux":      {"Mozilla/5.0 (X11; Linux x86_64; rv:125.0) Gecko/20100101 Firefox/125.0", Desktop},
	"curl":                  {"curl/8.5.0", Desktop},
	"empty":                 {"", Desktop},
}

func TestDeviceOf(t *testing.T) {
	for name, tc := range userAgents {
		t.Run(name, func(t *testing.T) {
			if got := DeviceOf(tc.ua); got != tc.want {
				t.Errorf("DeviceOf(%q) = %v, want %v", tc.ua, got, tc.want)
			}
		})
	}
}

func TestTarget(t *testing.T) {
	const ios, android, mac = "Mozilla/5.0 (iPhone; CPU iPhone OS 17_4 like Mac OS X)", "Mozilla/5.0 (Linux; Android 14; Pixel 8)", "Mozilla/5.0 (Macintosh; Intel Mac OS X 14_4)"
	all := linkcache.Entry{URL: "https://example.com/", Targets: &linkcache.Targets{
		IOS: "https://apps.apple.com/x", Android: "https://play.google.com/x", Desktop: "https://example.com/desktop"}}
	onlyIOS := linkcache.Entry{URL: "https://example.com/", Targets: &linkcache.Targets{IOS: "https://apps.apple.com/x"}}
	none := linkcache.Entry{URL: "https://example.com/"}
	tests := map[string]struct {
		e    linkcache.Entry
		ua   string
		want string
	}{
		"ios target":                   {all, ios, "https://apps.apple.com/x"},
		"android target":               {all, android, "https://play.google.com/x"},
		"desktop target":               {all, mac, "https://example.com/desktop"},
		"android without its target":   {onlyIOS, android, "https://example.com/"},
		"desktop without its target":   {onlyIOS, mac, "https://example.com/"},
		"ios with its target":          {onlyIOS, ios, "https://apps.apple.com/x"},
		"no targets, any user agent":   {none, ios, "https://example.com/"},
		"no user agent, desktop route": {all, "", "https://example.com/desktop"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := Target(tc.e, tc.ua); got != tc.want {
				t.Errorf("Target(%+v, %q) = %q, want %q", tc.e, tc.ua, got, tc.want)
			}
		})
	}
}

func TestIsPreviewBot(t *testing.T) {
	for _, ua := range []string{
		"Slackbot-LinkExpanding 1.0 (+https://api.slack.com/robots)",
		"Slack-ImgProxy (+https://api.slack.com/robots)",
		"facebookexternalhit/1.1 (+http://www.facebook.com/externalhit_uatext.php)",
		"Facebot", "Twitterbot/1.0",
		"Mozilla/5.0 (compatible; Discordbot/2.0; +https://discordapp.com)",
		"WhatsApp/2.23.20.0 A", "TelegramBot (like TwitterBot)",
		"LinkedInBot/1.0 (compatible; Mozilla/5.0; Apache-HttpClient +http://www.linkedin.com)",
		"Mozilla/5.0 (Windows NT 6.1; WOW64) SkypeUriPreview Preview/0.5",
		"Mozilla/5.0 (Macintosh) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/13.1.1 Safari/605.1.15 (Applebot/0.1)",
		"Iframely/1.3.1 (+https://iframely.com/docs/about)",
		"Mozilla/5.0 (compatible; redditbot/1.0; +http://www.reddit.com/feedback)",
		"Mozilla/5.0 (compatible; Pinterestbot/1.0; +http://www.pinterest.com/bot.html)",
		"Pinterest/0.2 (+https://www.pinterest.com/bot.html)",
		"Mozilla/5.0 (compatible; Embedly/0.2; +http://support.embed.ly/)",
		"Mozilla/5.0 (Windows NT 6.1) Chrome/56.0 Safari/537.36 Google (+https://developers.google.com/+/web/snippet/) Google-PageRenderer",
		"http.rb/5.1.1 (Mastodon/4.2.8; +https://mastodon.social/)",
	} {
		if !IsPreviewBot(ua) {
			t.Errorf("IsPreviewBot(%q) = false, want true", ua)
		}
	}
	for name, tc := range userAgents {
		if IsPreviewBot(tc.ua) {
			t.Errorf("%s: IsPreviewBot(%q) = true, want false", name, tc.ua)
		}
	}
	// In-app browsers name their app: a person, sent on.
	for _, ua := range []string{
		"Mozilla/5.0 (iPhone; CPU iPhone OS 17_0 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Mobile/15E148 Snapchat/12.60.0.50 (like Safari/8617.1.17.10.6, panda)",
		"Mozilla/5.0 (iPhone; CPU iPhone OS 17_0 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Mobile/15E148 [Pinterest/iOS]",
		"Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0 Mobile Safari/537.36 Viber/21.0",
	} {
		if IsPreviewBot(ua) {
			t.Errorf("in-app browser %q: IsPreviewBot = true, want false", ua)
		}
	}
	if !IsPreviewBot("Mozilla/5.0 (compatible; Snap URL Preview Service; bot; snapchat_preview@snap.com)") {
		t.Error("Snap's preview fetcher: IsPreviewBot = false, want true")
	}
}

// The classification runs on every redirect of a link with per-device
// targets, and on every GET of a visit-limited link: it allocates nothing.
func TestClassificationAllocatesNothing(t *testing.T) {
	e := linkcache.Entry{URL: "https://example.com/", Targets: &linkcache.Targets{Android: "https://play.google.com/x"}}
	ua := userAgents["chrome on windows"].ua
	if n := testing.AllocsPerRun(100, func() { _ = Target(e, ua); _ = IsPreviewBot(ua) }); n != 0 {
		t.Errorf("Target and IsPreviewBot allocate %v times per call, want 0", n)
	}
}

func BenchmarkTarget(b *testing.B) {
	e := linkcache.Entry{URL: "https://example.com/", Targets: &linkcache.Targets{
		IOS: "https://apps.apple.com/x", Android: "https://play.google.com/x"}}
	for _, name := range []string{"chrome on windows", "chrome on android", "safari on iphone"} {
		ua := userAgents[name].ua
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = Target(e, ua)
			}
		})
	}
}

func BenchmarkIsPreviewBot(b *testing.B) {
	ua := userAgents["chrome on windows"].ua
	b.ReportAllocs()
	for b.Loop() {
		_ = IsPreviewBot(ua)
	}
}

// A Location header is a URI: a stored URL's non-ASCII bytes (a query kept
// as written) go out percent-encoded, and an ASCII URL as it is.
func TestASCIIURL(t *testing.T) {
	for in, want := range map[string]string{
		"https://example.com/a?q=1#f":              "https://example.com/a?q=1#f",
		"https://xn--bcher-kva.example/%C3%BC?ä=ö": "https://xn--bcher-kva.example/%C3%BC?%C3%A4=%C3%B6",
		"https://example.com/?x=%3C%22ü":           "https://example.com/?x=%3C%22%C3%BC",
	} {
		if got := asciiURL(in); got != want {
			t.Errorf("asciiURL(%q) = %q, want %q", in, got, want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { _ = asciiURL("https://example.com/a?q=1") }); n != 0 {
		t.Errorf("an ASCII URL allocates %v times, want 0", n)
	}
}
