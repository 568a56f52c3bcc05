// Package migrate holds the versioned SQL files a package embeds and what
// the database recorded of them, shared by both stores: package pgmigrate
// applies them to PostgreSQL, [ApplySQLite] to SQLite. Each applied file
// is recorded with a SHA-256 checksum of its SQL: a file edited after it
// was applied is an error (ship a new migration instead), not skipped
// without a word.
package migrate

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/jetinbox/jetinbox/inbox"
)

type Migration struct {
	Version int
	Name    string
	SQL     string
}

// Checksum is the hex SHA-256 of the migration's SQL.
func (m Migration) Checksum() string {
	sum := sha256.Sum256([]byte(m.SQL))
	return hex.EncodeToString(sum[:])
}

// ErrEdited is returned when a migration recorded as applied no longer has
// the SQL it was applied with.
var ErrEdited = errors.New("migrate: an applied migration was edited")

// Load reads files named NNNN_name.sql from dir in fsys, in version order.
func Load(fsys fs.FS, dir string) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	var ms []Migration
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".sql") {
			continue
		}
		num, _, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("migrate: file %s is not named NNNN_name.sql", name)
		}
		b, err := fs.ReadFile(fsys, dir+"/"+name)
		if err != nil {
			return nil, fmt.Errorf("migrate: %w", err)
		}
		ms = append(ms, Migration{Version: v, Name: name, SQL: string(b)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	return ms, nil
}

// Embedded returns a function that loads the migrations of dir in an
// embedded fsys once and returns them on every call. A file misnamed in
// an embedded directory is a build bug: the function panics on it.
func Embedded(fsys fs.FS, dir string) func() []Migration {
	return sync.OnceValue(func() []Migration {
		ms, err := Load(fsys, dir)
		if err != nil {
			panic(err)
		}
		return ms
	})
}

// Script returns all migrations as one SQL script, for people who run their
// own migration tool.
func Script(component string, ms []Migration) string {
	var b strings.Builder
	for _, m := range ms {
		fmt.Fprintf(&b, "-- %s migration %d: %s\n%s\n", component, m.Version, m.Name, strings.TrimSpace(m.SQL))
	}
	return b.String()
}

// State is one migration as the database and the files see it: the
// stores return it as it is.
type State = inbox.MigrationState

// Status compares the files of component with what the database recorded.
