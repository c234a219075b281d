package useragent

import (
	"strings"
	"testing"

	"kurz.dev/pkg/clickevent"
)

func TestClassify(t *testing.T) {
	tests := map[string]struct {
		ua   string
		want Class
	}{
		"pinterest's in-app browser on ios": {
			"Mozilla/5.0 (iPhone; CPU iPhone OS 17_0 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Mobile/15E148 [Pinterest/iOS]",
			Class{Browser: "Safari", OS: "iOS", Device: Mobile}},
		"chrome on windows": {
			"Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 Safari/537.36",
			Class{Browser: "Chrome", OS: "Windows", Device: Desktop}},
		"edge on windows": {
			"Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 Safari/537.36 Edg/124.0.2478.80",
			Class{Browser: "Edge", OS: "Windows", Device: Desktop}},
		"opera on linux": {
			"Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0.0.0 Safari/537.36 OPR/106.0.0.0",
			Class{Browser: "Opera", OS: "Linux", Device: Desktop}},
		"firefox on macos": {
			"Mozilla/5.0 (Macintosh; Intel Mac OS X 14.4; rv:125.0) Gecko/20100101 Firefox/125.0",
			Class{Browser: "Firefox", OS: "macOS", Device: Desktop}},
		"safari on macos": {
			"Mozilla/5.0 (Macintosh; Intel Mac OS X 14_4_1) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.4.1 Safari/605.1.15",
			Class{Browser: "Safari", OS: "macOS", Device: Desktop}},
		"safari on iphone": {
			"Mozilla/5.0 (iPhone; CPU iPhone OS 17_4 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.4 Mobile/15E148 Safari/604.1",
			Class{Browser: "Safari", OS: "iOS", Device: Mobile}},
		"chrome on iphone": {
			"Mozilla/5.0 (iPhone; CPU iPhone OS 17_4 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) CriOS/124.0.6367.88 Mobile/15E148 Safari/604.1",
			Class{Browser: "Chrome", OS: "iOS", Device: Mobile}},
		"safari on ipad": {
			"Mozilla/5.0 (iPad; CPU OS 17_4 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.4 Mobile/15E148 Safari/604.1",
			Class{Browser: "Safari", OS: "iOS", Device: Tablet}},
		"chrome on android phone": {
			"Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.6367.82 Mobile Safari/537.36",
			Class{Browser: "Chrome", OS: "Android", Device: Mobile}},
		"android tablet": {
			"Mozilla/5.0 (Linux; Android 13; SM-X710) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 Safari/537.36",
			Class{Browser: "Chrome", OS: "Android", Device: Tablet}},
		"samsung internet": {
			"Mozilla/5.0 (Linux; Android 14; SM-S918B) AppleWebKit/537.36 (KHTML, like Gecko) SamsungBrowser/24.0 Chrome/117.0.0.0 Mobile Safari/537.36",
			Class{Browser: "Samsung Internet", OS: "Android", Device: Mobile}},
		"unknown client": {"SomeApp/1.0", Class{Browser: Other, OS: Other, Device: Desktop}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := Classify(tc.ua); got != tc.want {
				t.Errorf("Classify(%q) = %+v, want %+v", tc.ua, got, tc.want)
			}
		})
	}
}

func TestBots(t *testing.T) {
	bots := []string{
		"",
		"   ",
		"Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
		"Mozilla/5.0 (compatible; bingbot/2.0; +http://www.bing.com/bingbot.htm)",
		"Mozilla/5.0 (compatible; Yahoo! Slurp; http://help.yahoo.com/help/us/ysearch/slurp)",
		"DuckDuckBot/1.1; (+http://duckduckgo.com/duckduckbot.html)",
		"Mozilla/5.0 (compatible; Baiduspider/2.0; +http://www.baidu.com/search/spider.html)",
		"Mozilla/5.0 (compatible; YandexBot/3.0; +http://yandex.com/bots)",
		"facebookexternalhit/1.1 (+http://www.facebook.com/externalhit_uatext.php)",
		"Twitterbot/1.0",
		"Slackbot-LinkExpanding 1.0 (+https://api.slack.com/robots)",
		"Mozilla/5.0 (compatible; Discordbot/2.0; +https://discordapp.com)",
		"WhatsApp/2.23.20.0",
		"TelegramBot (like TwitterBot)",
		"LinkedInBot/1.0 (compatible; Mozilla/5.0; Apache-HttpClient +http://www.linkedin.com)",
		"Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_5) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/13.1.1 Safari/605.1.15 (Applebot/0.1)",
		"curl/8.5.0",
		"Wget/1.21.4",
		"python-requests/2.31.0",
		"Go-http-client/1.1",
		"Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) HeadlessChrome/124.0.0.0 Safari/537.36",
		"SomeCrawler/0.1",
		"my-spider",
		"LinkPreview/2.0",
	}
	for _, ua := range bots {
		got := Classify(ua)
		if want := (Class{Bot: true, Browser: BotBrowser, OS: Other, Device: BotDev}); got != want {
			t.Errorf("Classify(%q) = %+v, want %+v", ua, got, want)
		}
	}
}

// TestLinkPreviewFetchers: the fetchers chat apps and social networks send
// as soon as a link is posted are bots, so they never count as human clicks
// or unique visitors. Their real User-Agents, several with a browser's
// tokens besides.
func TestLinkPreviewFetchers(t *testing.T) {
	fetchers := map[string]string{
		"Slackbot-LinkExpanding": "Slackbot-LinkExpanding 1.0 (+https://api.slack.com/robots)",
		"Slack-ImgProxy":         "Slack-ImgProxy (+https://api.slack.com/robots)",
		"facebookexternalhit":    "facebookexternalhit/1.1 (+http://www.facebook.com/externalhit_uatext.php)",
		"Facebot":                "Facebot",
		"Twitterbot":             "Twitterbot/1.0",
		"Discordbot":             "Mozilla/5.0 (Macintosh; Intel Mac OS X 11.6; rv:92.0) Gecko/20100101 Firefox/92.0 (compatible; Discordbot/2.0; +https://discordapp.com)",
		"WhatsApp":               "WhatsApp/2.23.20.0 A",
		"TelegramBot":            "TelegramBot (like TwitterBot)",
		"LinkedInBot":            "LinkedInBot/1.0 (compatible; Mozilla/5.0; Apache-HttpClient +http://www.linkedin.com)",
		"SkypeUriPreview":        "Mozilla/5.0 (Windows NT 6.1; WOW64) SkypeUriPreview Preview/0.5 skype-url-preview@microsoft.com",
		"Applebot":               "Mozilla/5.0 (iPhone; CPU iPhone OS 17_4 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.4 Mobile/15E148 Safari/604.1 (Applebot/0.1; +http://www.apple.com/go/applebot)",
		"Iframely":               "Iframely/1.3.1 (+https://iframely.com/docs/about) Atlassian",
		"redditbot":              "Mozilla/5.0 (compatible; redditbot/1.0; +http://www.reddit.com/feedback)",
		"Pinterestbot":           "Mozilla/5.0 (compatible; Pinterestbot/1.0; +http://www.pinterest.com/bot.html)",
		"Embedly":                "Mozilla/5.0 (compatible; Embedly/0.2; +http://support.embed.ly/)",
		"Google-PageRenderer":    "Mozilla/5.0 (Windows NT 6.1; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/56.0.2924.87 Safari/537.36 Google (+https://developers.google.com/+/web/snippet/) Google-PageRenderer",
		"Mastodon":               "http.rb/5.1.1 (Mastodon/4.2.8; +https://mastodon.social/)",
	}
	want := Class{Bot: true, Browser: BotBrowser, OS: Other, Device: BotDev}
	for name, ua := range fetchers {
		t.Run(name, func(t *testing.T) {
			if got := Classify(ua); got != want {
				t.Errorf("Classify(%q) = %+v, want %+v", ua, got, want)
			}
		})
	}
}

// Every preview fetcher the redirect knows is a bot here: its fetches
// count neither as human clicks nor as visitors (the redirect README).
func TestPreviewFetchersAreBots(t *testing.T) {
	uas := []string{
		"Mozilla/5.0 (compatible; vkShare; +http://vk.com/dev/Share)",
		"Mozilla/5.0 (compatible; Bluesky Cardyb/1.1; +mailto:support@bsky.app)",
		"Mozilla/5.0 (Java) outbrain",
	}
	for _, tok := range clickevent.PreviewFetchers {
		uas = append(uas, "Mozilla/5.0 (X11; Linux x86_64) "+strings.ToUpper(tok)+" Safari/537.36")
	}
	for _, ua := range uas {
		if c := Classify(ua); !c.Bot {
			t.Errorf("Classify(%q) = %+v, want a bot", ua, c)
		}
	}
}

func TestReferrerHost(t *testing.T) {
	tests := map[string]string{
		"":                                                    Direct,
		"https://www.Example.com:8443/a?b=c":                  "example.com",
		"http://news.ycombinator.com/item?id=1":               "news.ycombinator.com",
		"https://t.co/abc":                                    "t.co",
		"android-app://com.google.android.gm/":                "com.google.android.gm",
		"not a url":                                           UnknownHost,
		"https://www./":                                       "www",
		"https://example.com./":                               "example.com",
		"%zz":                                                 UnknownHost,
		"https://a\u009b31mred.example/":                      UnknownHost,
		"https://evil\u202emoc.example/":                      UnknownHost,
		"https://a%c2%9b2j.example/":                          UnknownHost,
		"https://b\u00fccher.example/":                        "xn--bcher-kva.example",
		"https://xn--bcher-kva.example/":                      "xn--bcher-kva.example",
		"https://B\uff35CHER.example/":                        "bucher.example",
		"https://" + strings.Repeat("a", 64) + ".com/":        UnknownHost,
		"https://" + strings.Repeat("a", 8000) + ".com/p":     UnknownHost,
		"https://" + strings.Repeat("abcdefgh.", 28) + "com/": UnknownHost, // 255 bytes
		"https://" + strings.Repeat("a", 63) + ".com/":        strings.Repeat("a", 63) + ".com",
		"http://[2001:db8::1]:8080/":                          "2001:db8::1",
		"http://192.0.2.1/":                                   "192.0.2.1",
		"android-app://org.mozilla.firefox_beta/":             "org.mozilla.firefox_beta",
		"https://my_blog.example.com/x":                       "my_blog.example.com",
		"https://_dmarc.example.com/":                         "_dmarc.example.com",
		"https://a..b.example/":                               UnknownHost,
		"https://a!b.example/":                                UnknownHost,
	}
	for ref, want := range tests {
		if got := ReferrerHost(ref); got != want {
			t.Errorf("ReferrerHost(%q) = %q, want %q", ref, got, want)
		}
	}
}
