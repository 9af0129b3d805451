// Command yamlread reads a YAML stream from stdin exactly as kubectl does (the document splitter
// of k8s.io/apimachinery and sigs.k8s.io/yaml's YAML-to-JSON conversion, YAML 1.1 scalars) and
// prints the documents as a JSON array, skipping empty ones. The Rust tests compare the
// injector's manifest reader and writer against it.
package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

func main() {
	reader := utilyaml.NewYAMLReader(bufio.NewReader(os.Stdin))
	var out bytes.Buffer
	out.WriteString("[")
	first := true
	for {
		doc, err := reader.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			fail(err)
		}
		json, err := yaml.YAMLToJSON(doc)
		if err != nil {
			fail(err)
		}
		json = bytes.TrimSpace(json)
		if len(json) == 0 || string(json) == "null" {
			continue
		}
		if !first {
			out.WriteString(",")
		}
		first = false
		out.Write(json)
	}
	out.WriteString("]\n")
	os.Stdout.Write(out.Bytes())
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "yamlread:", err)
	os.Exit(1)
}
