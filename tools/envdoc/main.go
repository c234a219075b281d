// Command envdoc writes docs/configuration.md: every KURZ_* variable each
// service reads, with its default and the doc comment of the field that
// declares it. It reads the source, not a running binary: each service's
// app.Config in services/<name>/internal/app, walked the way pkg/config
// walks it (a nested struct without an env tag is descended into, wherever
// it is declared in kurz.dev), plus pkg/logging's Config, which
// pkg/server.Main loads for every service.
//
//	go run ./tools/envdoc -w docs/configuration.md   # make docs
//
// Its test fails when the committed file is stale.
package main

import (
	"flag"
	"fmt"
	"os"
)

func main() {
	root := flag.String("root", ".", "repository root")
	out := flag.String("w", "", "write to this file instead of stdout")
	flag.Parse()
	if err := run(*root, *out); err != nil {
		fmt.Fprintln(os.Stderr, "envdoc:", err)
		os.Exit(1)
	}
}

func run(root, out string) error {
	services, err := scan(root)
	if err != nil {
		return err
	}
	doc := render(services)
	if out == "" {
		_, err = os.Stdout.Write(doc)
		return err
	}
	return os.WriteFile(out, doc, 0o644)
}
