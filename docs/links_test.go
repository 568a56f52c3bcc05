// Package docs_test checks the project's Markdown: the README and the pages
// of docs/ link only to files that exist and to headings those files have.
package docs_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// link is a Markdown inline link's target, without a title.
var link = regexp.MustCompile(`\]\(([^()\s]+)\)`)

// TestRelativeLinks: every relative link of the READMEs and docs/ resolves to
// a file or directory of the repository, and a #fragment into a Markdown
// file to one of its headings, so moving text between pages cannot leave a
// link behind.
func TestRelativeLinks(t *testing.T) {
	t.Parallel()
	pages, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, "../README.md", "../deploy/README.md")
	anchors := map[string]map[string]bool{}
	headings := func(path string) map[string]bool {
		if a, ok := anchors[path]; ok {
			return a
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		a := headingAnchors(string(b))
		anchors[path] = a
		return a
	}
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		fenced := false
		for n, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "```") {
				fenced = !fenced
			}
			if fenced {
				continue
			}
			for _, m := range link.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				file, frag, _ := strings.Cut(target, "#")
				path := page
				if file != "" {
					path = filepath.Join(filepath.Dir(page), file)
					if _, err := os.Stat(path); err != nil {
						t.Errorf("%s:%d: %s: no such file", page, n+1, target)
						continue
					}
				}
				if frag != "" && strings.HasSuffix(path, ".md") && !headings(path)[frag] {
					t.Errorf("%s:%d: %s: %s has no heading #%s", page, n+1, target, path, frag)
				}
			}
		}
	}
}

// headingAnchors returns the anchors GitHub gives the headings of a
// Markdown document: lower case, spaces as hyphens, punctuation dropped.
func headingAnchors(doc string) map[string]bool {
	a := map[string]bool{}
	fenced := false
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
		}
		if fenced || !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var s strings.Builder
		for _, r := range strings.ToLower(title) {
			switch {
			case r == ' ':
				s.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				s.WriteRune(r)
			}
		}
		a[s.String()] = true
	}
	return a
}
