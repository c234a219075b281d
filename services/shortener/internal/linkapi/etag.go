package linkapi

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"slices"

	"kurz.dev/pkg/callmeta"
	"kurz.dev/pkg/rpcerr"
	"kurz.dev/services/shortener/internal/linkstore"
)

// etag is l's entity tag (Link.etag, the gateway's ETag): a MAC of the
// row's state (linkstore.Link.Version, which every write replaces) and of
// what else the representation is made of (the code and BaseURL, for the
// short URL), under Options.ETagKey, so that a tag shows nothing of
// PostgreSQL's transaction IDs. 16 characters of base64url.
func (s *Service) etag(l linkstore.Link) string {
	mac := hmac.New(sha256.New, s.etagKey)
	var b [12]byte
	binary.BigEndian.PutUint32(b[:4], l.Version)
	binary.BigEndian.PutUint64(b[4:], uint64(l.Updated.UnixMicro()))
	mac.Write(b[:])
	mac.Write([]byte(l.Code))
	mac.Write([]byte{0})
	mac.Write([]byte(s.opts.BaseURL))
	return base64.RawURLEncoding.EncodeToString(mac.Sum(nil)[:12])
}

// etagKeyWithoutOptions keys the tags of a Service built without
// Options.ETagKey (unit tests): the tags still change with every write;
// only their hiding of transaction IDs needs a secret key.
var etagKeyWithoutOptions = []byte("kurz link etags without a key")

// precondition is what a conditional change asks of the link's entity tag:
// the etag field of the request's link (the API's own field, AIP-154) and
// the entity tags of If-Match (callmeta.IfMatchKey, from the gateway).
// The change applies only if both hold; the zero precondition always does.
type precondition struct {
	field  string
	header []string
}

// preconditionOf reads the precondition of a call whose request carries field
// ("" when it has no etag field).
func preconditionOf(ctx context.Context, field string) (precondition, error) {
	header, err := callmeta.IncomingIfMatch(ctx)
	if err != nil {
		return precondition{}, rpcerr.Invalidf("etag", callmeta.ReasonIfMatchInvalid, "%v", err)
	}
	return precondition{field: field, header: header}, nil
}

func (c precondition) set() bool { return c.field != "" || len(c.header) > 0 }

// holds reports whether a link whose tag is etag meets c: tags compare
// strongly (RFC 9110), so a weak tag (W/"...") never matches.
func (c precondition) holds(etag string) bool {
	return (c.field == "" || c.field == etag) && (len(c.header) == 0 || slices.Contains(c.header, etag))
}

// check applies c to tenant's link key before a change: nil and no version
// for an unconditional change; else the link's current version, for the
// store to change the link only while it is still in that state. A link
// whose tag does not meet c, now or by the time the store changes it, is
// linkstore.ErrChanged (ABORTED ETAG_MISMATCH). A missing link is ErrNotFound: a precondition does not turn
// a 404 into a 412 (RFC 9110, 13.2.2). It returns the link it read too.
func (s *Service) check(ctx context.Context, tenant, key string, c precondition) (*uint32, linkstore.Link, error) {
	if !c.set() {
		return nil, linkstore.Link{}, nil
	}
	l, err := s.store.Get(ctx, tenant, key)
	if err != nil {
		return nil, l, err
	}
	if !c.holds(s.etag(l)) {
		return nil, l, linkstore.ErrChanged
	}
	v := l.Version
	return &v, l, nil
}
