package httpapi

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"

	qrcode "github.com/skip2/go-qrcode"
)

// QR image sizes, in pixels (PNG) or user units (SVG).
const (
	defaultQRSize = 256
	minQRSize     = 64
	maxQRSize     = 1024
)

// linkQR answers a QR code of the link's short URL: PNG by default,
// ?format=svg for SVG, ?size=N pixels.
func (a *API) linkQR(c *call) error {
	code, err := pathCode(c)
	if err != nil {
		return err
	}
	q := c.r.URL.Query()
	format := q.Get("format")
	if format != "" && format != "png" && format != "svg" {
		return badRequest(`format must be "png" (the default) or "svg"`)
	}
	size := defaultQRSize
	if s := q.Get("size"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < minQRSize || n > maxQRSize {
			return badRequest(fmt.Sprintf("size must be a whole number of pixels from %d to %d", minQRSize, maxQRSize))
		}
		size = n
	}
	link, err := a.fetchLink(c, code)
	if err != nil {
		return err
	}
	qr, err := qrcode.New(link.GetShortUrl(), qrcode.Medium)
	if err != nil {
		return internalError(fmt.Errorf("qr of %s: %w", code, err))
	}
	// The image of a code never changes; the link behind it may, and is
	// private to the tenant.
	c.w.Header().Set("Cache-Control", "private, max-age=3600")
	if format == "svg" {
		send(c.w, http.StatusOK, "image/svg+xml", qrSVG(qr.Bitmap(), size))
		return nil
	}
	png, err := qr.PNG(size)
	if err != nil {
		return internalError(fmt.Errorf("qr png of %s: %w", code, err))
	}
	send(c.w, http.StatusOK, "image/png", png)
	return nil
}

// qrSVG draws a QR module matrix (quiet zone included) as one SVG path: a
// 1×1 square per dark module, runs of them merged along each row.
func qrSVG(bitmap [][]bool, size int) []byte {
	n := len(bitmap)
	var path strings.Builder
	for y, row := range bitmap {
		for x := 0; x < len(row); {
			if !row[x] {
				x++
				continue
			}
			start := x
			for x < len(row) && row[x] {
				x++
			}
			fmt.Fprintf(&path, "M%d %dh%dv1h-%dz", start, y, x-start, x-start)
		}
	}
	return fmt.Appendf(nil, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" shape-rendering="crispEdges">`+
		`<rect width="%d" height="%d" fill="#fff"/><path fill="#000" d="%s"/></svg>`+"\n",
		size, size, n, n, n, n, path.String())
}
