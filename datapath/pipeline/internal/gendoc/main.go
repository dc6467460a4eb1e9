// Command gendoc writes the pipeline's tables and registers
// (pipeline.MarkdownTables) into docs/design.md between the markers
// "<!-- pipeline:begin -->" and "<!-- pipeline:end -->".
package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/seine-net/seine/datapath/pipeline"
)

const begin, end = "<!-- pipeline:begin -->\n", "<!-- pipeline:end -->"

func main() {
	path := os.Args[1]
	b, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	s := string(b)
	i, j := strings.Index(s, begin), strings.Index(s, end)
	if i < 0 || j < i {
		fmt.Fprintf(os.Stderr, "%s: markers %q and %q not found\n", path, begin, end)
		os.Exit(1)
	}
	s = s[:i+len(begin)] + pipeline.MarkdownTables() + s[j:]
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
