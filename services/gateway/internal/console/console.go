// Package console serves the gateway's web console: a small single-page app
// in plain HTML, CSS and JavaScript, embedded in the binary, that works on
// a tenant's links through the public JSON API with an API key the user
// signs in with. The files are served with a strict Content-Security-Policy
// (no inline scripts or styles, nothing from elsewhere) and ETags.
package console

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"time"
)

// Prefix is the path the console is served under; the path without the
// trailing slash redirects to it.
const Prefix = "/console/"

// ContentSecurityPolicy is sent with every console response: scripts,
// styles and API calls from the gateway's own origin only, images also from
// blob: (the QR codes) and data: URLs; no plugins, no framing, no <base>.
const ContentSecurityPolicy = "default-src 'self'; img-src 'self' blob: data:; object-src 'none'; " +
	"frame-ancestors 'none'; base-uri 'none'; form-action 'self'"

//go:embed assets
var assets embed.FS

// contentTypes maps the extensions of the embedded files to their media
// types; a file with another extension is refused by New, so none is ever
// served with a sniffed type.
var contentTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".svg":  "image/svg+xml",
}

// file is one embedded asset, ready to serve.
type file struct {
	body        []byte
	contentType string
	etag        string
}

// Handler serves the console's files under Prefix: index.html for Prefix
// itself, each asset by name, 404 for anything else.
type Handler struct {
	files map[string]file
}

// New reads the embedded assets and computes their ETags.
func New() (*Handler, error) {
	h := &Handler{files: map[string]file{}}
	err := fs.WalkDir(assets, "assets", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		ct, ok := contentTypes[path.Ext(p)]
		if !ok {
			return fmt.Errorf("console asset %s: no content type for its extension", p)
		}
		body, err := assets.ReadFile(p)
		if err != nil {
			return fmt.Errorf("console asset %s: %w", p, err)
		}
		sum := sha256.Sum256(body)
		h.files[strings.TrimPrefix(p, "assets/")] = file{body: body, contentType: ct, etag: `"` + hex.EncodeToString(sum[:12]) + `"`}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if _, ok := h.files["index.html"]; !ok {
		return nil, fmt.Errorf("console assets: no index.html")
	}
	return h, nil
}

// Register mounts the console on mux: GET (and HEAD) Prefix and below, and
// a redirect from the prefix without its slash, which carries the security
// headers too (its body is HTML).
func (h *Handler) Register(mux *http.ServeMux) {
	mux.Handle("GET "+Prefix, h)
	redirect := http.RedirectHandler(Prefix, http.StatusMovedPermanently)
	mux.HandleFunc("GET "+strings.TrimSuffix(Prefix, "/"), func(w http.ResponseWriter, r *http.Request) {
		secure(w.Header())
		redirect.ServeHTTP(w, r)
	})
}

// secure sets the security headers every console answer carries.
func secure(hdr http.Header) {
	hdr.Set("Content-Security-Policy", ContentSecurityPolicy)
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("X-Frame-Options", "DENY")
	hdr.Set("Referrer-Policy", "no-referrer")
	hdr.Set("Cross-Origin-Opener-Policy", "same-origin")
}

// ServeHTTP answers one file. Every answer, 404s included, carries the
// security headers; files are revalidated on each use (Cache-Control:
// no-cache) and answered 304 while their ETag matches.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hdr := w.Header()
	secure(hdr)
	name := strings.TrimPrefix(r.URL.Path, Prefix)
	if name == "" {
		name = "index.html"
	}
	f, ok := h.files[name]
	if !ok {
		// The path is not echoed: nothing of the request reaches a body.
		http.Error(w, "not found: the console has no such page", http.StatusNotFound)
		return
	}
	hdr.Set("Content-Type", f.contentType)
	hdr.Set("ETag", f.etag)
	hdr.Set("Cache-Control", "no-cache")
	http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(f.body))
}
