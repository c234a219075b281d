package servertest

import (
	"net"
	"sync/atomic"
)

// http2Preface opens every HTTP/2 connection a client makes.
const http2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// CountPings wraps c so that every HTTP/2 PING frame read from it that is
// not an acknowledgement adds one to pings: on a server's side of a
// connection (clientSide false, after the client's preface) the client's
// pings, on a client's side the server's.
func CountPings(c net.Conn, clientSide bool, pings *atomic.Int64) net.Conn {
	f := &pingFrames{Conn: c, pings: pings}
	if !clientSide {
		f.skip = len(http2Preface)
	}
	return f
}

// pingFrames follows the frames read from its peer: a 9-byte header
// (length, type, flags, stream), then the payload, in turn.
type pingFrames struct {
	net.Conn
	pings *atomic.Int64
	skip  int    // bytes of the preface or a payload still to pass
	head  []byte // the frame header read so far
}

func (c *pingFrames) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	for b := p[:n]; len(b) > 0; {
		if c.skip > 0 {
			k := min(c.skip, len(b))
			c.skip, b = c.skip-k, b[k:]
			continue
		}
		k := min(9-len(c.head), len(b))
		c.head, b = append(c.head, b[:k]...), b[k:]
		if len(c.head) == 9 {
			if c.head[3] == 0x6 && c.head[4]&0x1 == 0 { // PING, not an ACK
				c.pings.Add(1)
			}
			c.skip = int(c.head[0])<<16 | int(c.head[1])<<8 | int(c.head[2])
			c.head = c.head[:0]
		}
	}
	return n, err
}
