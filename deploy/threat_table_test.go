package deploy_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestAttackTableNamesRealTests: every row of README.md's "Attacks, tested"
// table names the tests that show it, and every test it names exists in
// the repository (this module or the project's), so a renamed or deleted
// test cannot leave a row that claims what nothing checks.
func TestAttackTableNamesRealTests(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Attacks, tested\n")
	if !ok {
		t.Fatal(`README.md has no "## Attacks, tested" section`)
	}
	if i := strings.Index(section, "\n## "); i >= 0 {
		section = section[:i]
	}
	defined := map[string]bool{}
	funcRE := regexp.MustCompile(`(?m)^func (Test\w+)\(`)
	err = filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range funcRE.FindAllSubmatch(src, -1) {
			defined[string(m[1])] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	testRE := regexp.MustCompile("`(Test\\w+)")
	rows := 0
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "| ") || strings.HasPrefix(line, "| attack") || strings.HasPrefix(line, "|---") {
			continue
		}
		rows++
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		if len(cells) != 4 {
			t.Errorf("row %d has %d cells, want 4 (attack, can, cannot, tests): %.80s", rows, len(cells), line)
			continue
		}
		names := testRE.FindAllStringSubmatch(cells[3], -1)
		if len(names) == 0 {
			t.Errorf("row %q names no test", cells[0])
		}
		for _, n := range names {
			if !defined[n[1]] {
				t.Errorf("row %q names %s, which no _test.go file defines", cells[0], n[1])
			}
		}
	}
	if rows < 11 {
		t.Errorf("the table has %d rows; the attacks it must list are more", rows)
	}
}
