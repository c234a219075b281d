package linkapi

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"unicode"
	"unicode/utf8"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/linkpass"
	"kurz.dev/pkg/rpcerr"
	"kurz.dev/pkg/textcut"
	"kurz.dev/services/shortener/internal/linkstore"
	"kurz.dev/services/shortener/internal/urlcheck"
)

// Bounds of the link features of issue #10.
const (
	// MaxTags is how many distinct tags one link carries at most.
	MaxTags = 10
	// MaxTagLength bounds one tag, in characters (ASCII only).
	MaxTagLength = 32
	// MaxVisitsLimit bounds max_visits.
	MaxVisitsLimit = 1_000_000_000
	// MaxTitleLength bounds a title, in characters (Unicode code points):
	// Shlink's bound, so that every Shlink title imports. At most 2,048
	// bytes of UTF-8.
	MaxTitleLength = 512
)

// checkTitle checks a link's title: valid UTF-8, at most MaxTitleLength
// characters, no control characters (C0, DEL, C1: a newline or an escape
// sequence in a title would break the lists and logs it is shown in). The
// title is kept as sent: nothing is trimmed or mapped, so what an import
// carries is what the link shows.
func checkTitle(title string) error {
	if !utf8.ValidString(title) {
		return rpcerr.Invalidf("title", ReasonTitleInvalid, "title is not valid UTF-8")
	}
	if n := utf8.RuneCountInString(title); n > MaxTitleLength {
		return rpcerr.Invalidf("title", ReasonTitleInvalid, "title has %d characters; at most %d are allowed", n, MaxTitleLength)
	}
	for i, r := range title {
		if unicode.IsControl(r) {
			return rpcerr.Invalidf("title", ReasonTitleInvalid,
				"title has a control character (%U) at byte %d: titles are one line of text, without newlines or tabs", r, i)
		}
	}
	return nil
}

// normalizeTag checks one tag and returns its lower-case form: 1 to
// MaxTagLength characters of a-z, 0-9, '.', '_' or '-' (upper-case ASCII
// letters are lowered; nothing else is mapped, so no look-alike from another
// script becomes a tag). field names the request field in the error.
func normalizeTag(field, tag string) (string, error) {
	if tag == "" || len(tag) > MaxTagLength {
		return "", rpcerr.Invalidf(field, ReasonTagsInvalid, "%s: %s is not a valid tag: a tag has 1 to %d characters", field, quoteShort(tag), MaxTagLength)
	}
	b := []byte(tag)
	for i, c := range b {
		switch {
		case c >= 'A' && c <= 'Z':
			b[i] = c + ('a' - 'A')
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '.', c == '_', c == '-':
		default:
			return "", rpcerr.Invalidf(field, ReasonTagsInvalid,
				"%s: %s is not a valid tag: use only a-z, 0-9, '.', '_' and '-'", field, quoteShort(tag))
		}
	}
	return string(b), nil
}

// normalizeTags checks tags and returns them lower-cased and de-duplicated,
// in their first order; at most MaxTags remain. Never nil.
func normalizeTags(tags []string) ([]string, error) {
	out := make([]string, 0, min(len(tags), MaxTags))
	for _, raw := range tags {
		t, err := normalizeTag("tags", raw)
		if err != nil {
			return nil, err
		}
		if slices.Contains(out, t) {
			continue
		}
		if len(out) == MaxTags {
			return nil, rpcerr.Invalidf("tags", ReasonTagsInvalid, "tags: a link carries at most %d distinct tags", MaxTags)
		}
		out = append(out, t)
	}
	return out, nil
}

// quoteShort quotes s for an error message, cut to 40 bytes so a huge input
// is not echoed back whole.
func quoteShort(s string) string { return strconv.Quote(textcut.Echo(s, 40)) }

// checkMaxVisits bounds a visit limit: 0 (none) to MaxVisitsLimit.
func checkMaxVisits(n int64) error {
	if n < 0 || n > MaxVisitsLimit {
		return rpcerr.Invalidf("max_visits", ReasonMaxVisitsInvalid,
			"max_visits must be 0 (no limit) to %d", MaxVisitsLimit)
	}
	return nil
}

// checkPassword refuses a password linkpass cannot set, with its message.
func checkPassword(password string) error {
	if err := linkpass.Validate(password); err != nil {
		return rpcerr.Invalidf("password", ReasonPasswordInvalid, "password: %s", err.Error())
	}
	return nil
}

// targetFields are the request fields of the device targets, in the order of
// linkstore.DeviceURLs.
var targetFields = [3]string{"device_targets.ios_url", "device_targets.android_url", "device_targets.desktop_url"}

// normalizeTargets validates each non-empty device URL exactly as long_url
// (urlcheck.Policy.Normalize) and returns their normal forms; nil or an
// empty message is no target at all.
func (s *Service) normalizeTargets(dt *shortenerv1.DeviceTargets) (linkstore.DeviceURLs, error) {
	raw := [3]string{dt.GetIosUrl(), dt.GetAndroidUrl(), dt.GetDesktopUrl()}
	var out [3]string
	for i, u := range raw {
		if u == "" {
			continue
		}
		n, err := s.policy.Normalize(u)
		if err != nil {
			s.countRefused(err)
			return linkstore.DeviceURLs{}, targetError(targetFields[i], err)
		}
		out[i] = n
	}
	return linkstore.DeviceURLs{IOS: out[0], Android: out[1], Desktop: out[2]}, nil
}

// scanTargets runs the scanner (blocklist) over each device URL, as over
// long_url.
func (s *Service) scanTargets(ctx context.Context, t linkstore.DeviceURLs) error {
	for i, u := range [3]string{t.IOS, t.Android, t.Desktop} {
		if u == "" {
			continue
		}
		if err := s.scan(ctx, u); err != nil {
			return targetError(targetFields[i], err)
		}
	}
	return nil
}

// targetError names the device-target field in a URL refusal (which
// toStatus would otherwise attribute to long_url); other errors pass as they
// are.
func targetError(field string, err error) error {
	var ue *urlcheck.Error
	if errors.As(err, &ue) {
		return rpcerr.Invalidf(field, ue.Reason, "%s: %s", field, ue.Message)
	}
	return err
}

// targetsOf returns l's device targets, or nil when it has none.
func targetsOf(l linkstore.Link) *linkstore.DeviceURLs {
	if l.IOSURL == "" && l.AndroidURL == "" && l.DesktopURL == "" {
		return nil
	}
	return &linkstore.DeviceURLs{IOS: l.IOSURL, Android: l.AndroidURL, Desktop: l.DesktopURL}
}
