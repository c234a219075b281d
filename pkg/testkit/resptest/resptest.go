// Package resptest is a fake Redis node for the tests of clients that
// speak RESP on connections of their own (the users of pkg/resp): it
// reads commands and answers each as the test says, on every connection
// it accepts.
package resptest

import (
	"bufio"
	"io"
	"net"
	"slices"
	"sync"
	"testing"

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
