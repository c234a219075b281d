// Command fixed302 answers every request with the same 302: the least an
// HTTP redirect costs with net/http, as a process of its own, so that its
// CPU can be read apart. deploy/bench/peers.sh runs it beside kurz's
// redirect service (redirectpeers measures both).
//
//	go run ./tools/fixed302 -addr 127.0.0.1:9307
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:9307", "listen address")
	location := flag.String("location", "https://example.com/bench", "Location of the 302")
	flag.Parse()

	srv := &http.Server{Addr: *addr, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Location", *location)
		w.Header().Set("Cache-Control", "private, max-age=0")
		w.WriteHeader(http.StatusFound)
	})}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		_ = srv.Shutdown(context.Background())
	}()
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintln(os.Stderr, "fixed302:", err)
		os.Exit(1)
	}
}
