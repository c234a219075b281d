package httpapi

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// Anonymous creation is refused to a browser on another site's page (a
// form or no-cors fetch there is sent without asking) and allowed to
// same-origin pages and to clients that are not browsers.
func TestAnonymousCreationRefusedCrossSite(t *testing.T) {
	a := &API{opts: Options{AllowAnonymous: true}}
	for name, tc := range map[string]struct {
		headers map[string]string
		wantOK  bool
	}{
		"curl":                  {nil, true},
		"same origin":           {map[string]string{"Origin": "http://k.test"}, true},
		"same-origin fetch":     {map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": "http://k.test"}, true},
		"user typed the URL":    {map[string]string{"Sec-Fetch-Site": "none"}, true},
		"cross-site form":       {map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example"}, false},
		"older browser, Origin": {map[string]string{"Origin": "https://evil.example"}, false},
		"opaque origin":         {map[string]string{"Origin": "null"}, false},
	} {
		r := httptest.NewRequest("POST", "http://k.test/v1/links", nil)
		for k, v := range tc.headers {
			r.Header.Set(k, v)
		}
		c := &call{w: httptest.NewRecorder(), r: r, st: &reqState{id: "t"}}
		err := a.authenticate(c, true, false)
		if tc.wantOK && (err != nil || c.st.tenant != "anonymous") {
			t.Errorf("%s: %v (tenant %q), want anonymous", name, err, c.st.tenant)
		}
		if !tc.wantOK {
			if code, _ := statusOf(t, err); code != http.StatusForbidden {
				t.Errorf("%s: %v, want 403", name, err)
			}
		}
	}
}
