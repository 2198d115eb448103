package rowactor_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Every Go block of README.md and docs/*.md is code that go vet and go test compile: the
// line right above the block names where it comes from,
//
//	<!-- snippet: example_test.go#name -->   the lines between "// snippet name: begin"
//	                                          and "// snippet name: end" in that file
//	<!-- snippet: examples/hello/main.go --> the whole file
//
// (paths from the repository root). A region is unindented by its begin marker's
// indentation. TestDocsSnippetsAreCode checks that each block is its source, character
// for character, and that every region a source file marks is shown somewhere, so that
// neither can drift. Regions live in Example functions (run when they have an Output
// line, which must not follow an end marker in one comment group) or in programs under
// examples/.
func TestDocsSnippetsAreCode(t *testing.T) {
	t.Parallel()
	docs, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	docs = append([]string{"README.md"}, docs...)
	marker := regexp.MustCompile(`^<!-- snippet: ([^ #]+)(?:#([A-Za-z0-9_.-]+))? -->$`)
	shown := map[string]map[string]bool{} // file → regions shown ("" for the whole file)
	blocks := 0
	for _, doc := range docs {
		text, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(text), "\n")
		for i := 0; i < len(lines); i++ {
			if strings.TrimSpace(lines[i]) != "```go" {
				continue
			}
			blocks++
			j := i + 1
			for j < len(lines) && strings.TrimSpace(lines[j]) != "```" {
				j++
			}
			block := strings.Join(lines[i+1:j], "\n") + "\n"
			var m []string
			if i > 0 {
				m = marker.FindStringSubmatch(lines[i-1])
			}
			if m == nil {
				t.Errorf("%s:%d: a Go block without a <!-- snippet: file#region --> line right above it", doc, i+1)
				i = j
				continue
			}
			file, region := m[1], m[2]
			if shown[file] == nil {
				shown[file] = map[string]bool{}
			}
			shown[file][region] = true
			src, err := os.ReadFile(file)
			if err != nil {
				t.Errorf("%s:%d: %v", doc, i, err)
				i = j
				continue
			}
			want := string(src)
			if region != "" {
				if want, err = snippetRegion(want, region); err != nil {
					t.Errorf("%s:%d: %s: %v", doc, i, file, err)
					i = j
					continue
				}
			}
			if block != want {
				t.Errorf("%s:%d: the block differs from %s; copy the source into the doc.\ndoc:\n%s\nsource:\n%s",
					doc, i+1, lines[i-1], block, want)
			}
			i = j
		}
	}
	if blocks == 0 {
		t.Fatal("no Go blocks found in README.md and docs/*.md")
	}
	// A region no doc shows is a stale marker or a missing snippet.
	begin := regexp.MustCompile(`(?m)^\s*// snippet ([A-Za-z0-9_.-]+): begin$`)
	for file := range shown {
		src, err := os.ReadFile(file)
		if err != nil {
			continue // reported above
		}
		for _, m := range begin.FindAllStringSubmatch(string(src), -1) {
			if !shown[file][m[1]] {
				t.Errorf("%s marks the region %q, but no doc shows it (<!-- snippet: %s#%s -->)", file, m[1], file, m[1])
			}
		}
		// "// Output:" counts only at the start of a function's last comment group: an end
		// marker right above it would quietly turn a run example into a compiled one.
		lines := strings.Split(string(src), "\n")
		for i := 1; i < len(lines); i++ {
			next := strings.TrimSpace(lines[i])
			if strings.HasPrefix(strings.TrimSpace(lines[i-1]), "// snippet ") &&
				(strings.HasPrefix(next, "// Output:") || strings.HasPrefix(next, "// Unordered output:")) {
				t.Errorf("%s:%d: leave a blank line between the snippet marker and %q, or go test does not run the example", file, i+1, next)
			}
		}
	}
}

// snippetRegion is the code between "// snippet name: begin" and "// snippet name: end",
// each line without the begin marker's indentation.
func snippetRegion(src, name string) (string, error) {
	lines := strings.Split(src, "\n")
	start, end, indent := -1, -1, ""
	for i, l := range lines {
		switch strings.TrimSpace(l) {
		case "// snippet " + name + ": begin":
			if start >= 0 {
				return "", fmt.Errorf("region %q begins twice", name)
			}
			start, indent = i+1, l[:len(l)-len(strings.TrimLeft(l, " \t"))]
		case "// snippet " + name + ": end":
			end = i
		}
	}
	if start < 0 || end < start {
		return "", fmt.Errorf("no region %q (// snippet %s: begin … // snippet %s: end)", name, name, name)
	}
	var out strings.Builder
	for _, l := range lines[start:end] {
		out.WriteString(strings.TrimPrefix(l, indent))
		out.WriteByte('\n')
	}
	return out.String(), nil
}

// The package's front page (doc.go) shows examples/hello's main function and what
// follows it (run), which CI compiles and runs: the two must be the same text, so the
// page cannot drift.
func TestPackageDocShowsTheHelloProgram(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	hello, err := os.ReadFile("examples/hello/main.go")
	if err != nil {
		t.Fatal(err)
	}
	// doc.go's code block, from main to the block's end (its first line that is neither
	// code nor a blank comment line).
	var shown []string
	in := false
	for _, l := range strings.Split(string(doc), "\n") {
		if l == "//\tfunc main() {" {
			in = true
		}
		if in && l != "//" && !strings.HasPrefix(l, "//\t") {
			break
		}
		if in {
			shown = append(shown, strings.TrimPrefix(strings.TrimPrefix(l, "//"), "\t"))
		}
	}
	src := string(hello)
	i := strings.Index(src, "func main() {\n")
	if i < 0 || len(shown) == 0 {
		t.Fatalf("no main function found: doc.go shows %d lines; examples/hello/main.go has main at %d", len(shown), i)
	}
	want := strings.TrimRight(src[i:], "\n") // main and what follows it, to the file's end
	if got := strings.TrimRight(strings.Join(shown, "\n"), "\n"); got != want {
		t.Errorf("doc.go's program differs from examples/hello/main.go's main:\n--- doc.go\n%s\n--- examples/hello/main.go\n%s", got, want)
	}
}
