// Package resptest is a fake Redis node for the tests of clients that
// speak RESP on connections of their own (the users of pkg/resp): it
// reads commands and answers each as the test says, on every connection
// it accepts.
package resptest

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"kurz.dev/pkg/resp"
)

// Replies with a meaning of their own.
const (
	// NoAnswer answers nothing: the command waits for ever, the
	// connection goes on with the next one.
	NoAnswer = ""
	// HangUp closes the connection instead of answering.
	HangUp = "\x00hang up"
)

// Node is the fake node.
type Node struct {
	ln    net.Listener
	reply func(args []string) string

	mu    sync.Mutex
	cmds  [][]string
	conns int
}

// Start listens on a free local port until the test ends. reply answers
// each command (args as sent) with raw RESP ("+OK\r\n", ...), NoAnswer or
// HangUp; it may block, and runs on the command's connection only.
func Start(t testing.TB, reply func(args []string) string) *Node {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveOn(t, ln, reply)
}

// StartTLS is Start behind TLS (ListenTLS); caFile is for the client to
// trust.
func StartTLS(t testing.TB, reply func(args []string) string) (n *Node, caFile string) {
	t.Helper()
	ln, caFile := ListenTLS(t)
	return serveOn(t, ln, reply), caFile
}

// ListenTLS listens on a free local port behind TLS, with a certificate of
// its own for 127.0.0.1, until the test ends; caFile is a PEM file of that
// certificate, for a client to trust. For fake servers of other protocols
// too.
func ListenTLS(t testing.TB) (ln net.Listener, caFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "resptest"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	caFile = filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err = tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return ln, caFile
}

func serveOn(t testing.TB, ln net.Listener, reply func(args []string) string) *Node {
	n := &Node{ln: ln, reply: reply}
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.mu.Lock()
			n.conns++
			n.mu.Unlock()
			wg.Go(func() { n.serve(c) })
		}
	})
	return n
}

// Addr is the node's address.
func (n *Node) Addr() string { return n.ln.Addr().String() }

// Commands returns every command received so far, in order.
func (n *Node) Commands() [][]string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.cmds)
}

// Conns returns how many connections the node accepted.
func (n *Node) Conns() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.conns
}

func (n *Node) serve(c net.Conn) {
	defer c.Close()
	r := bufio.NewReader(c)
	for {
		args, err := resp.ReadCommand(r)
		if err != nil {
			return
		}
		n.mu.Lock()
		n.cmds = append(n.cmds, args)
		n.mu.Unlock()
		switch out := n.reply(args); out {
		case NoAnswer:
		case HangUp:
			return
		default:
			if _, err := io.WriteString(c, out); err != nil {
				return
			}
		}
	}
}
