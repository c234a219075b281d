package redirector

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	_ "embed"
	"encoding/base64"
	"errors"
	"html/template"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"kurz.dev/pkg/capacity"
	"kurz.dev/pkg/linkpass"
)

// PasswordDomain is the limiter domain charged, with descriptors ip, net
// (netKey) and code, before each password attempt is checked: it bounds the
// Argon2 work an attacker can cause, per address and per network. Its
// rules fail closed, and so does the handler when the limiter does not
// answer.
const PasswordDomain = "links.password"

// PasswordGuessDomain is the limiter domain of wrong passwords, with
// descriptors ip and code: looked at (cost 0) before the hash, charged only
// after a wrong password, so that right passwords (everyone behind one
// office NAT opening a link) do not use up the guesses. Fails closed too.
// It gets no net: the guesses in flight are gated by the look's remaining
// count (pkg/guessgate), which the limiter reports for the rule with the
// least headroom relative to its limit, so a second rule of another limit
// there could report more guesses left than the address has.
const PasswordGuessDomain = "links.password.guesses"

// netKey is the key of addr's network in the PasswordDomain rules keyed on
// net: an IPv4 address's /24, an IPv6 address's /48 (an IPv4-mapped one is
// its IPv4 twin's); "" for an invalid address, which no rule keyed on net
// then applies to, as none keyed on ip does. The per-address key
// (clientip.Keying) is an IPv6 client's /64, and one site's /48 holds
// 65,536 of them, each with its own allowance: the network bounds a client
// that rotates through them.
func netKey(addr netip.Addr) string {
	if !addr.IsValid() {
		return ""
	}
	addr = addr.Unmap().WithZone("")
	bits := 48
	if addr.Is4() {
		bits = 24
	}
	p, err := addr.Prefix(bits)
	if err != nil {
		return ""
	}
	return p.String()
}

// errGuessRefused is the look's refusal of a password attempt: the
// limiter's decision says why (guesses used up, or no answer).
var errGuessRefused = errors.New("password guesses refused")

// The password form's CSRF protection is a signed double-submit token: the
// GET that renders the form sets a cookie holding a random nonce and puts
// nonce.issued-at.HMAC-SHA256(secret, code|nonce|issued-at) in a hidden
// field; a POST must carry both, with the same nonce, a valid MAC and an age
// under formTokenTTL. Another site can make a browser send the cookie only
// with SameSite=Strict navigation rules it cannot meet, and cannot read the
// nonce to forge the field; the MAC binds the field to this code and this
// service's secret, and the age bounds a leaked page.
const (
	formCookie   = "kurz_form"
	formField    = "token"
	formTokenTTL = time.Hour
	// clockSkew is how far in the future an issued-at may be (replicas'
	// clocks differ a little).
	clockSkew = time.Minute
	// maxFormBytes caps a POST body: a password (at most 128 characters,
	// percent-encoded) and a token fit many times over.
	maxFormBytes = 4 << 10
)

// Reasons a form token is refused; logged, never shown.
var (
	errNoCookie      = errors.New("no form cookie")
	errMalformed     = errors.New("malformed form token")
	errNonceMismatch = errors.New("form token nonce differs from the cookie's")
	errBadSignature  = errors.New("form token signature invalid")
	errExpired       = errors.New("form token expired")
)

// formTokens issues and checks the double-submit tokens under one secret,
// which every replica must share.
type formTokens struct{ secret []byte }

var b64 = base64.RawURLEncoding

// issue returns a fresh nonce (the cookie) and the token (the form field)
// for code at now.
func (f formTokens) issue(code string, now time.Time) (nonce, token string) {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	nonce = b64.EncodeToString(b[:])
	iat := strconv.FormatInt(now.Unix(), 10)
	return nonce, nonce + "." + iat + "." + f.sign(code, nonce, iat)
}

// sign is the MAC of code|nonce|iat; none of the three can hold a '|'.
func (f formTokens) sign(code, nonce, iat string) string {
	m := hmac.New(sha256.New, f.secret)
	m.Write([]byte(code))
	m.Write([]byte{'|'})
	m.Write([]byte(nonce))
	m.Write([]byte{'|'})
	m.Write([]byte(iat))
	return b64.EncodeToString(m.Sum(nil))
}

// check verifies a POST's token against its cookie nonce for code at now.
func (f formTokens) check(code, cookieNonce, token string, now time.Time) error {
	if cookieNonce == "" {
		return errNoCookie
	}
	nonce, rest, ok1 := strings.Cut(token, ".")
	iat, mac, ok2 := strings.Cut(rest, ".")
	if !ok1 || !ok2 || nonce == "" {
		return errMalformed
	}
	if subtle.ConstantTimeCompare([]byte(nonce), []byte(cookieNonce)) != 1 {
		return errNonceMismatch
	}
	if !hmac.Equal([]byte(mac), []byte(f.sign(code, nonce, iat))) {
		return errBadSignature
	}
	secs, err := strconv.ParseInt(iat, 10, 64)
	if err != nil {
		return errMalformed
	}
	issued := time.Unix(secs, 0)
	if now.Sub(issued) >= formTokenTTL || issued.After(now.Add(clockSkew)) {
		return errExpired
	}
	return nil
}

// formStyle is the form's only style; the CSP allows exactly it, by hash.
const formStyle = `body{font:16px/1.5 system-ui,sans-serif;margin:0;display:flex;justify-content:center}` +
	`main{max-width:22rem;padding:2rem 1rem}label,input,button{display:block;width:100%;box-sizing:border-box}` +
	`input{margin:.25rem 0 1rem;padding:.5rem;font:inherit}button{padding:.5rem;font:inherit;cursor:pointer}` +
	`.msg{color:#a40000;font-weight:600}code{word-break:break-all}`

// formCSP lets the page load nothing but its own style, be framed by no one,
// and post only to kurz. form-action also lists http: and https: because
// Chrome applies it to the redirects that follow a form submission: with
// 'self' alone the 303 to the link's (external) target would be blocked. The
// page reflects nothing a form could be injected through, and naming the
// target's origin instead would reveal it to anyone who opens the form.
var formCSP = "default-src 'none'; style-src " + formStyleHash +
	"; form-action 'self' https: http:; frame-ancestors 'none'; base-uri 'none'"

// formStyleHash is formStyle's CSP source: the form and the preview page
// share the style.
var formStyleHash = func() string {
	sum := sha256.Sum256([]byte(formStyle))
	return "'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"
}()

//go:embed form.html
var formHTML string

var formTemplate = template.Must(template.New("form").Parse(formHTML))

// formPage is the template's data: the code (plausible, and escaped anyway),
// the request's query in the form's action (escaped), the token, and one
// of the fixed messages below. Nothing else from the request, and never
// the target, reaches the page.
type formPage struct {
	Style template.CSS
	Code  string
	// Action is where the form posts: /code, with the request's query
	// (formQuery), so that the link's query conditions see on the POST
	// what the visitor's link carried.
	Action  string
	Token   string
	Message string
}

// maxFormQuery bounds the query a form carries into its action: a link is
// shared with a few parameters of tens of bytes, and the rules read no
// more than their first 16 KiB.
const maxFormQuery = 2 << 10

// formAction is the action of code's form (and the link of its preview):
// "/code", with the whole
// parameters of the first maxFormQuery bytes of rawQuery. The template
// escapes it as the URL attribute it is (percent-encoding what a URL may
// not hold, then HTML-escaping), and it stays on this path: a query
// cannot change where the password goes.
func formAction(code, rawQuery string) string {
	if len(rawQuery) > maxFormQuery {
		rawQuery = rawQuery[:maxFormQuery+1]
		if i := strings.LastIndexByte(rawQuery, '&'); i >= 0 {
			rawQuery = rawQuery[:i]
		} else {
			rawQuery = ""
		}
	}
	if rawQuery == "" {
		return "/" + code
	}
	return "/" + code + "?" + rawQuery
}

// The form's messages.
const (
	msgForged      = "This form has expired or was not sent from this page. Please enter the password again."
	msgWrong       = "Wrong password."
	msgTooMany     = "Too many attempts. Please wait a while before trying again."
	msgUnavailable = "Passwords cannot be checked right now. Please try again shortly."
	msgBusy        = "Too many passwords are being checked right now, so yours was not checked. Please try again in a moment."
)

// form renders the password form for code with status and msg, setting a
// fresh nonce cookie.
func (h *Handler) form(w http.ResponseWriter, r *http.Request, code string, status int, msg string) int {
	nonce, token := h.tokens.issue(code, time.Now())
	var body bytes.Buffer
	if err := formTemplate.Execute(&body, formPage{Style: formStyle, Code: code, Action: formAction(code, r.URL.RawQuery), Token: token, Message: msg}); err != nil {
		page(w, http.StatusInternalServerError)
		return http.StatusInternalServerError
	}
	http.SetCookie(w, &http.Cookie{
		Name: formCookie, Value: nonce, Path: "/" + code, MaxAge: int(formTokenTTL / time.Second),
		HttpOnly: true, Secure: h.secure(r), SameSite: http.SameSiteStrictMode,
	})
	hdr := w.Header()
	hdr.Set("Content-Type", "text/html; charset=utf-8")
	hdr.Set("Cache-Control", "no-store")
	hdr.Set("Content-Security-Policy", formCSP)
	hdr.Set("X-Frame-Options", "DENY")
	hdr.Set("Referrer-Policy", "no-referrer")
	hdr.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(body.Bytes())
	return status
}

// secure reports whether the client reached kurz over TLS: directly, or
// as told by a trusted proxy in front (Config.Clients), whose
// X-Forwarded-Proto entry is the last.
func (h *Handler) secure(r *http.Request) bool {
	if r.TLS != nil {
		return true
	}
	if !h.cfg.Clients.FromTrustedProxy(r) {
		return false
	}
	v := r.Header.Values("X-Forwarded-Proto")
	if len(v) == 0 {
		return false
	}
	last := v[len(v)-1]
	if i := strings.LastIndexByte(last, ','); i >= 0 {
		last = last[i+1:]
	}
	return strings.EqualFold(strings.TrimSpace(last), "https")
}

// passwordWait bounds how long a password attempt waits for an Argon2
// slot. The gate (pkg/capacity) lets at most as many attempts wait as there
// are slots: a check takes ~33 ms of a core, so that queue is served within
// about one round of checks, and a longer one would add no throughput (the
// slots set it), only latency for the visitors queued behind a flood, each
// of them a request held open. 250 ms is several such rounds, room for a
// loaded CPU; an attempt still waiting then finds the checks falling
// behind, and is better told at once to come back than queued further.
const passwordWait = 250 * time.Millisecond

// newArgonGate is the gate of the Argon2 checks: checks of them run at
// once (each takes ~19 MiB and a core), and at most as many attempts wait
// for a slot, each at most passwordWait.
func newArgonGate(checks int) *capacity.Gate { return capacity.New(checks, passwordWait) }

// verify checks password against hash in one of h.argon's slots. With
// every slot busy and as many attempts waiting, or still busy after
// passwordWait, it returns capacity.ErrBusy without checking anything; it
// returns ctx's error if the request ends first.
func (h *Handler) verify(ctx context.Context, hash, password string) (bool, error) {
	release, err := h.argon.Acquire(ctx)
	if err != nil {
		return false, err
	}
	defer release()
	return linkpass.Verify(hash, password)
}
