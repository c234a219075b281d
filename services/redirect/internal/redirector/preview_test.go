package redirector

import (
	"bytes"
	"strings"
	"testing"

	"kurz.dev/pkg/linkcode"
)

// TestPreviewOf: "code+" previews code; '+' is no code character, so no
// code or alias can end with one and be taken for its own preview.
func TestPreviewOf(t *testing.T) {
	for _, tc := range []struct {
		path, code string
		ok         bool
	}{
		{"abcd+", "abcd", true},
		{"my-launch_2+", "my-launch_2", true},
		{"abc+", "", false},   // the code is too short
		{"abcd++", "", false}, // one '+', at the end
		{"ab+cd", "", false},
		{"+abcd", "", false},
		{"abcd", "", false},
		{"ab/cd+", "", false},
		{strings.Repeat("a", linkcode.MaxLength+1) + "+", "", false},
	} {
		code, ok := previewOf(tc.path)
		if ok != tc.ok || ok && code != tc.code {
			t.Errorf("previewOf(%q) = %q, %v; want %q, %v", tc.path, code, ok, tc.code, tc.ok)
		}
	}
	for _, s := range []string{"abcd+", "ab+cd", "+abcd"} {
		if linkcode.Plausible(s) || linkcode.AliasProblem(s) == "" {
			t.Errorf("%q is a plausible code or a valid alias: its preview would be ambiguous", s)
		}
	}
}

// hostileURL is a destination written to break out of the page: quotes,
// markup, a javascript: lookalike and a few KiB of it.
var hostileURL = `https://example.com/"><script>alert(1)</script>'onmouseover='x'?next=javascript:alert(document.cookie)&` +
	strings.Repeat("%3Cscript%3E", 300)

// The page names the destination escaped as text, links only to the short
// link, and carries no script and the style the CSP's hash allows.
func TestPreviewTemplate(t *testing.T) {
	var b bytes.Buffer
	if err := previewTemplate.Execute(&b, previewPage{Style: formStyle, Code: `a"<b>`, Href: `/a"<b>`, URL: hostileURL, Varies: true}); err != nil {
		t.Fatal(err)
	}
	body := b.String()
	for _, bad := range []string{"<script", `"><`, `'onmouseover='`, `a"<b>`, `href="javascript`} {
		if strings.Contains(body, bad) {
			t.Errorf("the page holds %q unescaped:\n%.600s", bad, body)
		}
	}
	if !strings.Contains(body, "<code>https://example.com/&#34;&gt;&lt;script&gt;alert(1)&lt;/script&gt;&#39;onmouseover=&#39;x&#39;?next=javascript:alert(document.cookie)&amp;%3Cscript%3E") {
		t.Errorf("the destination is not shown whole, escaped as text:\n%.600s", body)
	}
	if !strings.Contains(body, `<a href="/a%22%3cb%3e"`) {
		t.Errorf("the link does not lead to the short link:\n%s", body)
	}
	if !strings.Contains(body, "<style>"+formStyle+"</style>") || !strings.Contains(previewCSP, formStyleHash) ||
		!strings.HasPrefix(previewCSP, "default-src 'none';") || strings.Contains(previewCSP, "script-src") {
		t.Errorf("style %q and CSP %q disagree", formStyle, previewCSP)
	}
	if !strings.Contains(body, "may be sent to another destination") || !strings.Contains(body, `name="robots" content="noindex`) {
		t.Errorf("the page does not say the link varies, or lets robots index it:\n%.600s", body)
	}
}

// A protected or visit-limited link's page names no destination, whatever
// the data holds.
func TestPreviewTemplateProtected(t *testing.T) {
	for _, tc := range []struct {
		p    previewPage
		want string
	}{
		{previewPage{Protected: true}, "protected by a password"},
		{previewPage{Limited: true}, "limited number of visits"},
	} {
		var b bytes.Buffer
		tc.p.Style, tc.p.Code, tc.p.Href, tc.p.URL = formStyle, "abcd", "/abcd", "https://secret.example/"
		if err := previewTemplate.Execute(&b, tc.p); err != nil {
			t.Fatal(err)
		}
		if body := b.String(); strings.Contains(body, "secret.example") || !strings.Contains(body, tc.want) {
			t.Errorf("the page, want %q and no destination:\n%s", tc.want, body)
		}
	}
}

// TestShownURL: the page's destination is all ASCII, its host in punycode
// wherever it sits in the authority, and an ASCII one is left alone.
func TestShownURL(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"https://example.com/a?b=c#d", "https://example.com/a?b=c#d"},
		{"https://\u0430pple.com", "https://xn--pple-43d.com"},
		{"https://\u0430pple.com:8443/\u202e?q=\u00e4", "https://xn--pple-43d.com:8443/%E2%80%AE?q=%C3%A4"},
		{"https://x@\u0430pple.com./p", "https://x@xn--pple-43d.com/p"},
		{"https://example.com/\u00e4#\u00e4", "https://example.com/%C3%A4#%C3%A4"},
		{"https://\u0430pple.com?q", "https://xn--pple-43d.com?q"},
		{"https://a\u200b\ufffd.com/", "https://a%E2%80%8B%EF%BF%BD.com/"}, // no host punycode takes: escaped
	} {
		if got := shownURL(tc.in); got != tc.want {
			t.Errorf("shownURL(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
