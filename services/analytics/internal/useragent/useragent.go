// Package useragent classifies a click's User-Agent (bot or not, browser,
// operating system, device class) and its referrer (host), with small tables
// kept here rather than a dependency: the categories the stats report are
// few, and a table we own can be fixed the day a new crawler shows up.
package useragent

import (
	"net"
	"net/url"
	"strings"
	"unicode"

	"kurz.dev/pkg/clickevent"
	"kurz.dev/pkg/urlnorm"
)

// Device classes.
const (
	Desktop = "desktop"
	Mobile  = "mobile"
	Tablet  = "tablet"
	BotDev  = "bot"
)

// Other names a browser or operating system outside the tables.
const Other = "Other"

// BotBrowser is the browser of every bot.
const BotBrowser = "Bot"

// Class is what a User-Agent says about the client.
type Class struct {
	Bot     bool
	Browser string
	OS      string
	Device  string
}

// botTokens are lowercase substrings of the User-Agents of crawlers,
// link-preview fetchers (every one the redirect knows:
// clickevent.PreviewFetchers), HTTP libraries and headless browsers. Some
// are broad on purpose ("bot", "spider"): a rare human browser mistaken for
// a bot costs less in the stats than every unknown crawler counted as a
// human.
var botTokens = append([]string{
	"googlebot", "bingbot", "slurp", "duckduckbot", "baiduspider", "yandex",
	"ahrefs", "semrush",
	"curl/", "wget", "python-requests", "python-urllib", "aiohttp", "go-http-client",
	"java/", "okhttp", "apache-httpclient", "libwww-perl", "node-fetch", "axios/",
	"headlesschrome", "phantomjs", "lighthouse", "pingdom", "uptimerobot", "scrapy",
	"bot", "crawler", "spider", "fetcher", "monitor",
}, clickevent.PreviewFetchers...)

// Classify reads ua. An empty User-Agent is a bot: every browser sends one.
func Classify(ua string) Class {
	l := strings.ToLower(strings.TrimSpace(ua))
	if l == "" {
		return Class{Bot: true, Browser: BotBrowser, OS: Other, Device: BotDev}
	}
	for _, t := range botTokens {
		if strings.Contains(l, t) {
			return Class{Bot: true, Browser: BotBrowser, OS: Other, Device: BotDev}
		}
	}
	c := Class{Browser: browser(l), OS: operatingSystem(l)}
	c.Device = device(l, c.OS)
	return c
}

// browser checks the tokens that other browsers copy last: Edge and Opera
// claim to be Chrome, Chrome claims to be Safari, everyone claims Mozilla.
func browser(l string) string {
	switch {
	case has(l, "edg/", "edge/", "edga/", "edgios/"):
		return "Edge"
	case has(l, "opr/", "opera", "opt/", "opios/"):
		return "Opera"
	case has(l, "samsungbrowser/"):
		return "Samsung Internet"
	case has(l, "firefox/", "fxios/"):
		return "Firefox"
	case has(l, "chrome/", "crios/", "chromium/"):
		return "Chrome"
	case has(l, "safari/") && has(l, "version/"), has(l, "iphone", "ipad") && has(l, "applewebkit"):
		return "Safari"
	}
	return Other
}

func operatingSystem(l string) string {
	switch {
	case has(l, "iphone", "ipad", "ipod"):
		return "iOS"
	case has(l, "android"):
		return "Android"
	case has(l, "windows"):
		return "Windows"
	case has(l, "cros"):
		return "ChromeOS"
	case has(l, "macintosh", "mac os x"):
		return "macOS"
	case has(l, "linux", "x11"):
		return "Linux"
	}
	return Other
}

func device(l, os string) string {
	switch {
	case has(l, "ipad", "tablet"), os == "Android" && !has(l, "mobile"):
		return Tablet
	case has(l, "mobi", "iphone", "ipod", "windows phone"), os == "Android":
		return Mobile
	}
	return Desktop
}

func has(l string, tokens ...string) bool {
	for _, t := range tokens {
		if strings.Contains(l, t) {
			return true
		}
	}
	return false
}

// Direct is the referrer host of a click without a Referer.
const Direct = ""

// UnknownHost is the referrer host of a Referer that is not a URL with a
// host.
const UnknownHost = "(unknown)"

// ReferrerHost returns the lowercase host of a Referer, without a leading
// "www.", so www.example.com and example.com count together, and in
// punycode, so bücher.example and xn--bcher-kva.example do too; Direct when
// ref is empty, UnknownHost for a host no DNS name could be. App referrers such as android-app://com.google.android.gm/ keep
// their package name as host.
func ReferrerHost(ref string) string {
	ref = strings.TrimSpace(ref)
	if ref == "" {
		return Direct
	}
	u, err := url.Parse(ref)
	if err != nil || u.Hostname() == "" {
		return UnknownHost
	}
	h := strings.TrimSuffix(strings.ToLower(u.Hostname()), ".")
	// url.Parse keeps C1 controls (U+009B is an 8-bit CSI), format
	// characters such as U+202E and other unprintables in a host: a
	// visitor's Referer must not put them into a tenant's statistics.
	if strings.IndexFunc(h, func(r rune) bool { return !unicode.IsPrint(r) || r == ' ' }) >= 0 {
		return UnknownHost
	}
	// A name counts in its punycode form (as browsers send it, and as
	// the shortener stores hosts), and only if DNS could hold it: no label
	// over 63 bytes, no name over 253, so a visitor cannot make a 500-byte
	// "host" of a tenant's statistics.
	switch {
	case net.ParseIP(h) != nil:
	case isASCII(h):
		// Kept as sent (underscores too: my_blog.example.com, app
		// packages such as org.mozilla.firefox_beta), within DNS's bounds.
		if !dnsShaped(h) {
			return UnknownHost
		}
	default:
		ascii, err := urlnorm.Host(h)
		if err != nil {
			return UnknownHost
		}
		h = ascii
	}
	if strings.HasPrefix(h, "www.") && len(h) > len("www.") {
		h = h[len("www."):]
	}
	return h
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// dnsShaped reports whether h (lowercase ASCII) is a name DNS could hold:
// labels of 1 to 63 letters, digits, '-' or '_', at most 253 bytes in all.
func dnsShaped(h string) bool {
	if len(h) == 0 || len(h) > 253 {
		return false
	}
	for label := range strings.SplitSeq(h, ".") {
		if len(label) == 0 || len(label) > 63 {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}
