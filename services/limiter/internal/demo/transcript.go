package demo

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// TranscriptResult is what the notes' shortener session showed.
type TranscriptResult struct {
	Codes []string // two default (permuted) codes, then a random one
	// Invalid is the body answered for javascript:alert(1).
	Invalid string
	// Known and Unknown are the X-Source headers of two redirects each, with
	// their statuses.
	Known, Unknown [2]string
}

// Transcript replays the notes' curl session against the gateway (POST
// /links) and the redirect service, printing it as it goes.
func Transcript(ctx context.Context, w io.Writer, rdb *redis.ClusterClient, gateway, redirect string) (TranscriptResult, error) {
	var r TranscriptResult
	client := &http.Client{
		Timeout:       5 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	post := func(body string) (string, error) {
		fmt.Fprintf(w, "$ curl -s -XPOST %s/links -d '%s'\n", gateway, body)
		resp, err := client.Post(gateway+"/links", "application/json", strings.NewReader(body))
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		b = bytes.TrimSpace(b)
		fmt.Fprintf(w, "%s\n", b)
		return string(b), err
	}
	code := func(body string) string {
		const marker = `"code":"`
		i := strings.Index(body, marker)
		if i < 0 {
			return ""
		}
		rest := body[i+len(marker):]
		return rest[:max(0, strings.IndexByte(rest, '"'))]
	}
	for _, body := range []string{
		`{"longUrl":"https://example.com/a/very/long/path?utm=1"}`,
		`{"longUrl":"https://example.com/b"}`,
		`{"longUrl":"https://example.com/c","mode":"random"}`,
	} {
		out, err := post(body)
		if err != nil {
			return r, err
		}
		r.Codes = append(r.Codes, code(out))
	}
	var err error
	if r.Invalid, err = post(`{"longUrl":"javascript:alert(1)"}`); err != nil {
		return r, err
	}
	out, err := post(`{"longUrl":"https://example.com/d"}`)
	if err != nil {
		return r, err
	}
	d := code(out)
	fmt.Fprintf(w, "# delete its cache key, then redirect twice\n")
	if err := rdb.Del(ctx, "l:"+d).Err(); err != nil {
		return r, err
	}
	get := func(c string) (string, error) {
		fmt.Fprintf(w, "$ curl -s -o /dev/null -D - %s/%s\n", redirect, c)
		resp, err := client.Get(redirect + "/" + c)
		if err != nil {
			return "", err
		}
		resp.Body.Close()
		fmt.Fprintf(w, "HTTP/1.1 %s\n", resp.Status)
		if loc := resp.Header.Get("Location"); loc != "" {
			fmt.Fprintf(w, "location: %s\n", loc)
		}
		src := resp.Header.Get("X-Source")
		fmt.Fprintf(w, "x-source: %s\n", src)
		return fmt.Sprintf("%d %s", resp.StatusCode, src), nil
	}
	for i := range 2 {
		if r.Known[i], err = get(d); err != nil {
			return r, err
		}
	}
	unknown := "zzzzzzz"
	// A previous run may have left the negative entry: start from the db.
	if err := rdb.Del(ctx, "l:"+unknown).Err(); err != nil {
		return r, err
	}
	for i := range 2 {
		if r.Unknown[i], err = get(unknown); err != nil {
			return r, err
		}
	}
	return r, nil
}

// CheckTranscript reports every difference from the notes' session.
func CheckTranscript(r TranscriptResult) []string {
	var bad []string
	if len(r.Codes) != 3 || len(r.Codes[0]) != 7 || len(r.Codes[2]) != 7 {
		return append(bad, fmt.Sprintf("codes %q: want three 7-character codes", r.Codes))
	}
	// The notes' codes were consecutive; since the security review the
	// shortener permutes its IDs, so that nobody can walk them.
	if consecutive(r.Codes[0], r.Codes[1]) {
		bad = append(bad, fmt.Sprintf("default codes %s, %s are consecutive: anyone could walk them", r.Codes[0], r.Codes[1]))
	}
	if consecutive(r.Codes[1], r.Codes[2]) {
		bad = append(bad, "the random code follows the default ones")
	}
	if r.Invalid != `{"error":"invalid url"}` {
		bad = append(bad, fmt.Sprintf("javascript:alert(1) answered %s, want {\"error\":\"invalid url\"}", r.Invalid))
	}
	if r.Known != [2]string{"302 db", "302 cache"} {
		bad = append(bad, fmt.Sprintf("redirects after the cache flush: %q, want 302 from db, then cache", r.Known))
	}
	if r.Unknown != [2]string{"404 db", "404 cache"} {
		bad = append(bad, fmt.Sprintf("unknown code: %q, want 404 from db, then cache", r.Unknown))
	}
	return bad
}

const alphabet = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"

func consecutive(a, b string) bool {
	value := func(s string) int64 {
		var n int64
		for _, c := range s {
			n = n*62 + int64(strings.IndexRune(alphabet, c))
		}
		return n
	}
	return len(a) == len(b) && value(b) == value(a)+1
}
