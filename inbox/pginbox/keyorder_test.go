package pginbox_test

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/driver"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/migrate"
	"github.com/jetinbox/jetinbox/internal/pgmigrate"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

// TestKeyOrderMigration upgrades an inbox made by the migrations before
// the key was reordered, with claims committed in it, and checks that the
// key is (message_id, scope) compared bytewise, that every committed claim
// is still a duplicate when claimed again (and the same ID in another
// scope is not), and that lookups by ID use the key. "prebuilt" is the
// large-inbox path: the new key built beforehand by hand, concurrently,
// which the migration adopts instead of building another.
func TestKeyOrderMigration(t *testing.T) {
	ms, err := migrate.Load(os.DirFS("."), "migrations")
	if err != nil {
		t.Fatal(err)
	}
	var before []migrate.Migration
	for _, m := range ms {
		if m.Version < 4 {
			before = append(before, m)
		}
	}
	for _, prebuilt := range []bool{false, true} {
		name := "built"
		if prebuilt {
			name = "prebuilt"
		}
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			pool, err := pgxpool.New(ctx, testenv.NewDatabase(t))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			if _, err := pgmigrate.Apply(ctx, pool, "inbox", before); err != nil {
				t.Fatal(err)
			}
			claims := []driver.Claim{
				{ID: "b", Fingerprint: inbox.Fingerprint([]byte("b")), Subject: "s"},
				{ID: "a", Fingerprint: inbox.Fingerprint([]byte("a")), Subject: "s"},
				{ID: "ä", Fingerprint: inbox.Fingerprint([]byte("ä")), Subject: "s"},
			}
			claimIn := func(scope string, cs []driver.Claim) []driver.ClaimResult {
				t.Helper()
				var res []driver.ClaimResult
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					var err error
					res, err = pginbox.ClaimTx(ctx, tx, scope, cs)
					return err
				})
				if err != nil {
					t.Fatal(err)
				}
				return res
			}
			for _, r := range claimIn("ledger", claims) {
				if r.State != driver.ClaimFresh {
					t.Fatalf("before the migration: %+v", r)
				}
			}
			if prebuilt {
				if _, err := pool.Exec(ctx, `CREATE UNIQUE INDEX CONCURRENTLY inbox_key ON inbox (message_id COLLATE "C", scope COLLATE "C")`); err != nil {
					t.Fatal(err)
				}
			}
			// The key's storage: a key built anew is a new file, an
			// adopted one keeps its own.
			var keyBefore uint32
			if err := pool.QueryRow(ctx, `SELECT pg_relation_filenode(oid) FROM pg_class WHERE relname = $1`, map[bool]string{false: "inbox_pkey", true: "inbox_key"}[prebuilt]).Scan(&keyBefore); err != nil {
				t.Fatal(err)
			}

			var heapBefore uint32
			if err := pool.QueryRow(ctx, `SELECT pg_relation_filenode('inbox')`).Scan(&heapBefore); err != nil {
				t.Fatal(err)
			}
			if n, err := pginbox.New(pool).Migrate(ctx); err != nil || n != len(ms)-len(before) {
				t.Fatalf("migrate: applied %d, %v; want %d", n, err, len(ms)-len(before))
			}
			if err := pginbox.New(pool).CheckSchema(ctx); err != nil {
				t.Fatal(err)
			}

			var def string
			var keyAfter uint32
			if err := pool.QueryRow(ctx, `SELECT pg_get_indexdef(conindid), pg_relation_filenode(conindid) FROM pg_constraint WHERE conrelid = 'inbox'::regclass AND contype = 'p'`).Scan(&def, &keyAfter); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(def, "(message_id, scope)") || !strings.Contains(def, "UNIQUE") {
				t.Fatalf("primary key after the migration: %s", def)
			}
			// Only the key is rebuilt: the rows stay where they are.
			var heapAfter uint32
			if err := pool.QueryRow(ctx, `SELECT pg_relation_filenode('inbox')`).Scan(&heapAfter); err != nil {
				t.Fatal(err)
			}
			if heapAfter != heapBefore {
				t.Errorf("the migration rewrote the inbox table (file %d, then %d)", heapBefore, heapAfter)
			}
			if prebuilt != (keyAfter == keyBefore) {
				t.Errorf("prebuilt %v: key before %d, after %d", prebuilt, keyBefore, keyAfter)
			}
			var colls string
			if err := pool.QueryRow(ctx, `SELECT string_agg(a.attname || ' ' || c.collname, ', ' ORDER BY a.attname)
FROM pg_attribute a JOIN pg_collation c ON c.oid = a.attcollation
WHERE a.attrelid = 'inbox'::regclass AND a.attname IN ('scope', 'message_id')`).Scan(&colls); err != nil {
				t.Fatal(err)
			}
			if colls != "message_id C, scope C" {
				t.Fatalf("key collations: %s", colls)
			}

			// What was claimed before is a duplicate; a new ID, or the
			// same ID in another scope, is fresh.
			again := append(claims[:len(claims):len(claims)], driver.Claim{ID: "c", Fingerprint: inbox.Fingerprint([]byte("c")), Subject: "s"})
			res := claimIn("ledger", again)
			for i, r := range res[:len(claims)] {
				if r.State != driver.ClaimDuplicate {
					t.Errorf("claim %q again after the migration: %+v, want a duplicate", again[i].ID, r)
				}
			}
			if res[len(claims)].State != driver.ClaimFresh {
				t.Errorf("new claim after the migration: %+v", res[len(claims)])
			}
			for _, r := range claimIn("other", claims) {
				if r.State != driver.ClaimFresh {
					t.Errorf("same ID in another scope: %+v, want fresh", r)
				}
			}
			var n int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM inbox`).Scan(&n); err != nil || n != 7 {
				t.Fatalf("rows after the migration: %d, %v", n, err)
			}

			// Lookups by ID, as the claim reads what was there, go
			// through the key.
			var plan strings.Builder
			err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `SET LOCAL enable_seqscan = off`); err != nil {
					return err
				}
				rows, err := tx.Query(ctx, `EXPLAIN SELECT status FROM inbox WHERE scope = $1 AND message_id = ANY($2::text[])`, "ledger", []string{"a", "b"})
				if err != nil {
					return err
				}
				lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
				plan.WriteString(strings.Join(lines, "\n"))
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(plan.String(), "inbox_pkey") {
				t.Errorf("lookup by ID does not use the key:\n%s", plan.String())
			}
		})
	}
}
