package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
)

// maxListBody bounds the answers a list --all reads in all (each page is
// bounded by maxAnswerBody too); links export streams longer lists.
var maxListBody = 1 << 30 // a variable for the test

// maxListPages bounds the pages a list --all asks for: ten million links
// in pages of 1,000, more than maxListBody holds; a gateway sending pages
// of one small item each reaches it long before that.
var maxListPages = 10_000 // a variable for the test

// listPages reads the items (the answer's field, "links" or "tenants") of
// a list route's pages from token on: one page, or with all every page to
// the last. It returns them as the gateway sent them, for -o json, with
// the next page's token. --all stops at a page token sent before (a
// gateway that loops would be asked forever), at an empty page that names
// a next one (every page but the last ends on an item: a gateway sending
// such pages with fresh tokens would be asked forever, tens of bytes
// each), after maxListPages pages and at maxListBody of answers in all;
// hint ends the two bounds' errors. A page the rate limit refuses (429
// RATE_LIMITED: a free key's pages spend its list rule) waits its
// Retry-After and is asked again, as list --clicks and imports wait
// (waitOut's bounds), the waits counted over the whole list so that the
// list's total wait is bounded too (maxImportWaits of a minute at most):
// stopping would throw away the pages already read.
func (c *cli) listPages(ctx context.Context, gw *gateway, path string, q url.Values, field, token string, all bool, hint string) ([]json.RawMessage, string, error) {
	var items []json.RawMessage
	sent := map[string]bool{}
	read, pages, waits := 0, 0, 0
	for {
		if token != "" {
			if sent[token] {
				return nil, "", fmt.Errorf("GET %s: the gateway answered page token %q a second time; stopped after %d %s", path, token, len(items), field)
			}
			sent[token] = true
			q.Set("page_token", token)
		}
		var raw []byte
		for {
			var err error
			if raw, err = gw.call(ctx, "GET", path, q, nil); err == nil {
				break
			}
			again, werr := c.waitOut(ctx, err, waits, rateLimited)
			if werr != nil {
				return nil, "", werr
			} else if !again {
				return nil, "", err
			}
			waits++
		}
		if read += len(raw); read > maxListBody {
			return nil, "", fmt.Errorf("GET %s: the pages add up to more than %d MiB; stopped after %d %s: %s", path, maxListBody>>20, len(items), field, hint)
		}
		var page map[string]json.RawMessage
		var list []json.RawMessage
		if err := json.Unmarshal(raw, &page); err != nil {
			return nil, "", fmt.Errorf("GET %s: the answer is not a list of %s: %w", path, field, err)
		}
		if f, ok := page[field]; ok {
			if err := json.Unmarshal(f, &list); err != nil {
				return nil, "", fmt.Errorf("GET %s: the answer is not a list of %s: %w", path, field, err)
			}
		}
		token = ""
		if t, ok := page["nextPageToken"]; ok {
			if err := json.Unmarshal(t, &token); err != nil {
				return nil, "", fmt.Errorf("GET %s: the answer's nextPageToken is not a string: %w", path, err)
			}
		}
		items = append(items, list...)
		if !all || token == "" {
			return items, token, nil
		}
		if len(list) == 0 {
			return nil, "", fmt.Errorf("GET %s: the gateway answered an empty page with a next page token; stopped after %d %s", path, len(items), field)
		}
		if pages++; pages >= maxListPages {
			return nil, "", fmt.Errorf("GET %s: more than %d pages; stopped after %d %s: %s", path, maxListPages, len(items), field, hint)
		}
	}
}
