package redirector

import (
	"bytes"
	"strings"

	"kurz.dev/pkg/clickevent"
	"kurz.dev/pkg/linkcache"
)

// Device is the class of client a link's per-device targets choose by.
type Device uint8

// The device classes.
const (
	// Desktop is every client that is neither iOS nor Android, iPadOS
	// Safari included: since iPadOS 13 it sends a Macintosh User-Agent
	// ("desktop-class browsing"), indistinguishable from a Mac's without
	// JavaScript, so an iPad in its default mode gets the desktop target.
	Desktop Device = iota
	// IOS is an iPhone, an iPad (in mobile mode) or an iPod touch.
	IOS
	// Android is any Android phone or tablet.
	Android
)

// String names the class as the notes do.
func (d Device) String() string {
	switch d {
	case IOS:
		return "ios"
	case Android:
		return "android"
	}
	return "desktop"
}

// DeviceOf classifies a User-Agent. It allocates nothing: the tokens are
// matched case-sensitively as every browser and in-app web view writes them.
func DeviceOf(ua string) Device {
	// One pass for the three iOS tokens (all start with "iP"), one for
	// Android, where four Contains read the whole string four times.
	for s := ua; ; {
		i := strings.Index(s, "iP")
		if i < 0 {
			break
		}
		s = s[i+2:]
		if strings.HasPrefix(s, "hone") || strings.HasPrefix(s, "ad") || strings.HasPrefix(s, "od") {
			return IOS
		}
	}
	if strings.Contains(ua, "Android") {
		return Android
	}
	return Desktop
}

// Target is where an active entry sends a client with User-Agent ua: the
// target of its device class if the link has one, else the link's URL.
// Links without targets never look at ua.
func Target(e linkcache.Entry, ua string) string {
	if u := deviceTarget(e, ua); u != "" {
		return u
	}
	return e.URL
}

// deviceTarget is the entry's target for ua's device class, "" when it has
// none.
func deviceTarget(e linkcache.Entry, ua string) string {
	t := e.Targets
	if t == nil {
		return ""
	}
	switch DeviceOf(ua) {
	case IOS:
		return t.IOS
	case Android:
		return t.Android
	}
	return t.Desktop
}

// previewTokens are clickevent.PreviewFetchers: the fetchers that must not
// spend a visit-limited link's visits nor see where it leads (the analytics
// service counts them as bots).
var previewTokens = clickevent.PreviewFetchers

// previewTokenBytes are previewTokens for bytes.Contains.
var previewTokenBytes = func() [][]byte {
	b := make([][]byte, len(previewTokens))
	for i, t := range previewTokens {
		b[i] = []byte(t)
	}
	return b
}()

// IsPreviewBot reports whether ua is a link-preview fetcher's. It allocates
// nothing: the User-Agent is lowercased (ASCII) into a stack buffer, and only
// its first 512 bytes are read, where every fetcher names itself.
func IsPreviewBot(ua string) bool {
	var buf [512]byte
	n := copy(buf[:], ua)
	l := buf[:n]
	for i, c := range l {
		if 'A' <= c && c <= 'Z' {
			l[i] = c + 'a' - 'A'
		}
	}
	for _, t := range previewTokenBytes {
		if bytes.Contains(l, t) {
			return true
		}
	}
	return false
}
