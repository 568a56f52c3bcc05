package outbox_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"unicode"
)

// storeSuffixes are what a name carried when one package held a function
// per store ("MigrateSQLite", "NewRelayOn", "ConfigOf").
var storeSuffixes = []string{"SQLite", "Sqlite", "Postgres", "PG", "Pg", "Of", "On"}

// storeOps are what a store value carries as methods; as package functions
// they would be written out once per backend package again.
var storeOps = map[string]bool{"Migrate": true, "MigrationSQL": true, "MigrationStatus": true, "CheckSchema": true, "Prune": true, "Backlog": true, "Ping": true}

// TestNoStoreSuffixedTwins: in the library's packages (everything but
// cmd/ and internal/), no exported name is another exported name of the
// same package (or type, for methods) plus a store suffix, none ends in
// "Of", and the store's operations (Migrate, CheckSchema, Prune, …) are
// methods of its value, never package functions: a store is picked by its
// value (pginbox.New, sqliteoutbox.New), not by a twin of each function. It reads the packages' sources, tests
// excluded.
func TestNoStoreSuffixedTwins(t *testing.T) {
	t.Parallel()
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command to list packages with: %v", err)
	}
	out, err := exec.CommandContext(t.Context(), goCmd, "list", "-f", "{{.ImportPath}} {{.Dir}}", "github.com/jetinbox/jetinbox/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, dir, _ := strings.Cut(line, " ")
		if strings.Contains(path, "/internal/") || strings.Contains(path, "/cmd/") {
			continue
		}
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		var parsed []*ast.File
		fset := token.NewFileSet()
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			af, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			parsed = append(parsed, af)
		}
		names := exported(parsed)
		checked += len(names)
		for name := range names {
			scope, base := "", name
			if i := strings.LastIndexByte(name, '.'); i >= 0 {
				scope, base = name[:i+1], name[i+1:]
			}
			if scope == "" && storeOps[base] {
				t.Errorf("%s: %s is a package function; it belongs to the store value", path, name)
			}
			if ofName(base) {
				t.Errorf("%s: %s ends in Of", path, name)
			}
			for _, suf := range storeSuffixes {
				if twin := strings.TrimSuffix(base, suf); twin != base && names[scope+twin] {
					t.Errorf("%s: %s is %s%s plus a store suffix", path, name, scope, twin)
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no exported names found: the package list is wrong")
	}
}

// ofName reports a name ending in the word "Of" ("MessageOf", not "Proof").
func ofName(name string) bool {
	rest, ok := strings.CutSuffix(name, "Of")
	return ok && rest != "" && unicode.IsLower(rune(rest[len(rest)-1]))
}

// exported returns a package's exported top-level names and, as
// "Type.Method", its exported methods.
func exported(files []*ast.File) map[string]bool {
	names := map[string]bool{}
	for _, f := range files {
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() {
					continue
				}
				if d.Recv == nil || len(d.Recv.List) == 0 {
					names[d.Name.Name] = true
					continue
				}
				if recv := recvName(d.Recv.List[0].Type); recv != "" {
					names[recv+"."+d.Name.Name] = true
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						if s.Name.IsExported() {
							names[s.Name.Name] = true
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							if n.IsExported() {
								names[n.Name] = true
							}
						}
					}
				}
			}
		}
	}
	return names
}

// recvName is the name of a method's receiver type, without * or type
// parameters.
func recvName(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}
