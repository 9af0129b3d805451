// Command yamlread reads a manifest stream from stdin exactly as kubectl does (`kubectl apply -f`'s
// stream visitor: k8s.io/apimachinery's YAMLOrJSONDecoder, which reads a stream that starts with
// `{` as consecutive JSON values and anything else as YAML documents split on `---` lines, each
// converted by sigs.k8s.io/yaml with YAML 1.1 scalars) and prints the documents as a JSON array,
// skipping empty ones. The Rust tests compare the injector's manifest reader and writer against it.
package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

func main() {
	// The buffer size kubectl's stream visitor uses to guess JSON or YAML.
	decoder := utilyaml.NewYAMLOrJSONDecoder(bufio.NewReader(os.Stdin), 4096)
	var out bytes.Buffer
	out.WriteString("[")
	first := true
	for {
		var document runtime.RawExtension
		err := decoder.Decode(&document)
		if err == io.EOF {
			break
		}
		if err != nil {
			fail(err)
		}
		raw := bytes.TrimSpace(document.Raw)
		if len(raw) == 0 || string(raw) == "null" {
			continue
		}
		if !first {
			out.WriteString(",")
		}
		first = false
		out.Write(raw)
	}
	out.WriteString("]\n")
	os.Stdout.Write(out.Bytes())
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "yamlread:", err)
	os.Exit(1)
}
