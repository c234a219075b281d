package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"

	"sigs.k8s.io/yaml"
)

// yamlWriter collects what a command writes for -o json and, on flush,
// writes it as YAML: each JSON document one YAML document ("---" between
// them). What is not JSON (a CSV export, a key printed with --quiet) is
// written as it came.
type yamlWriter struct {
	out io.Writer
	buf bytes.Buffer
}

func (w *yamlWriter) Write(p []byte) (int, error) { return w.buf.Write(p) }

func (w *yamlWriter) flush() error {
	docs, err := jsonDocuments(w.buf.Bytes())
	if err != nil || len(docs) == 0 {
		_, err := w.out.Write(w.buf.Bytes())
		return err
	}
	var out bytes.Buffer
	for i, doc := range docs {
		y, err := yaml.JSONToYAML(doc)
		if err != nil {
			_, err := w.out.Write(w.buf.Bytes())
			return err
		}
		if i > 0 {
			out.WriteString("---\n")
		}
		out.Write(y)
	}
	_, err = w.out.Write(out.Bytes())
	return err
}

// jsonDocuments splits b into its JSON documents; an error if b is not a
// sequence of JSON documents.
func jsonDocuments(b []byte) ([]json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	var docs []json.RawMessage
	for {
		var doc json.RawMessage
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, err
		}
		docs = append(docs, doc)
	}
}
