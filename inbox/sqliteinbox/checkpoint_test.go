package sqliteinbox_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jetinbox/jetinbox/inbox/sqliteinbox"
)

// TestCheckpointsBesideTheWriter: what a COMMIT put in the write-ahead log
// reaches the database file without the writer copying it: a background
// checkpoint does it, well before the log reaches the writer's own
// autocheckpoint. With checkpoints left to the writer (SQLite's default of
// 1000 pages), these 200 pages would stay in the log. Closing the pool,
// twice, stops them without an error.
func TestCheckpointsBesideTheWriter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ckpt.db")
	db, err := sqliteinbox.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var auto int
	if err := db.QueryRow("PRAGMA wal_autocheckpoint").Scan(&auto); err != nil {
		t.Fatal(err)
	}
	if auto < 5000 {
		t.Fatalf("the writer's wal_autocheckpoint is %d pages: its COMMITs would still copy the log back", auto)
	}
	before := fileSize(t, path)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(`CREATE TABLE filler (b BLOB)`); err != nil {
		t.Fatal(err)
	}
	blob := []byte(strings.Repeat("x", 4000))
	for range 200 { // about 200 pages of 4 KiB
		if _, err := tx.Exec(`INSERT INTO filler VALUES (?)`, blob); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for fileSize(t, path) < before+150*4096 {
		if time.Now().After(deadline) {
			t.Fatalf("the database file is %d bytes 2 minutes after the COMMIT (%d before it): the log was not checkpointed beside the writer", fileSize(t, path), before)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil { // twice is harmless
		t.Fatal(err)
	}
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}
