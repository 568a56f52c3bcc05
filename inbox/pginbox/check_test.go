package pginbox_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/driver"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

// TestClassifyWithoutSQLState: Classify takes any error a driver, a pooler
// or a proxy may hand back, a server error with a short or empty SQLSTATE
// among them, without panicking; and it puts the database's and the
// deployment's faults (connection class 08 with a pooler's 08P01, a
// shutdown, a read-only node, a missing table, function or grant) apart from
// the input's (classes 22 and 23), which alone can reject a message.
func TestClassifyWithoutSQLState(t *testing.T) {
	t.Parallel()
	st := pginbox.New(nil)
	for _, c := range []struct {
		err  error
		want driver.ErrorKind
	}{
		{&pgconn.PgError{}, driver.ErrorOther},
		{&pgconn.PgError{Code: "0"}, driver.ErrorOther},
		{&pgconn.PgError{Code: "08"}, driver.ErrorConn},
		{errors.New("no server error at all"), driver.ErrorOther},
		{&pgconn.PgError{Code: "08P01", Message: "transaction blocks not allowed in statement pooling mode"}, driver.ErrorConn},
		{&pgconn.PgError{Code: "57P01"}, driver.ErrorConn},
		{&pgconn.PgError{Code: "25006"}, driver.ErrorConn},
		{&pgconn.PgError{Code: "42P01"}, driver.ErrorConn},
		{&pgconn.PgError{Code: "42501"}, driver.ErrorConn},
		{&pgconn.PgError{Code: "42883"}, driver.ErrorConn},
		{&pgconn.PgError{Code: "3F000"}, driver.ErrorConn},
		{&pgconn.PgError{Code: "53100"}, driver.ErrorConn},
		{&pgconn.PgError{Code: "57014"}, driver.ErrorOther},
		{&pgconn.PgError{Code: "40P01"}, driver.ErrorRetryTx},
		{&pgconn.PgError{Code: "22001"}, driver.ErrorData},
		{&pgconn.PgError{Code: "23505"}, driver.ErrorData},
	} {
		var got driver.ErrorKind
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("Classify(%#v) panicked: %v", c.err, r)
				}
			}()
			got = st.Classify(c.err)
		}()
		if got != c.want {
			t.Errorf("Classify(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// TestCheckRefusesUnfitDatabases: Check passes on a migrated database,
// directly and through a pooler in transaction mode, and fails, saying
// what to do, where every batch would fail for the deployment's reason: an
// unmigrated database, a read-only one, a pooler in statement mode, a role
// without the grants.
func TestCheckRefusesUnfitDatabases(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	migrated := testenv.NewDatabase(t)
	newDBAt(t, migrated) // migrates
	u, err := url.Parse(migrated)
	if err != nil {
		t.Fatal(err)
	}
	name := strings.TrimPrefix(u.Path, "/")
	unmigrated := testenv.NewDatabase(t)
	readOnly := testenv.NewDatabase(t)
	newDBAt(t, readOnly)
	admin, err := pgx.Connect(ctx, migrated)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	ru, _ := url.Parse(readOnly)
	if _, err := admin.Exec(ctx, `ALTER DATABASE `+pgx.Identifier{strings.TrimPrefix(ru.Path, "/")}.Sanitize()+` SET default_transaction_read_only = on`); err != nil {
		t.Fatal(err)
	}
	role := "nogrants_" + strings.ReplaceAll(name, "-", "_")
	if _, err := admin.Exec(ctx, `CREATE ROLE `+pgx.Identifier{role}.Sanitize()+` LOGIN`); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, `GRANT SELECT ON jetinbox_migrations TO `+pgx.Identifier{role}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	noGrants := *u
	noGrants.User = url.User(role)
	txPooler := testenv.NewPgBouncer(t, testenv.PgBouncerOptions{})
	stmtPooler := testenv.NewPgBouncer(t, testenv.PgBouncerOptions{PoolMode: "statement"})
	for _, c := range []struct {
		name, url string
		want      error
		says      string
	}{
		{"migrated", migrated, nil, ""},
		{"migrated, transaction pooler", testenv.WithQueryExecMode(txPooler.URL(name), "cache_describe"), nil, ""},
		{"unmigrated", unmigrated, inbox.ErrNotMigrated, "jetinbox migrate"},
		{"read-only", readOnly, inbox.ErrDatabaseUnfit, "read-only"},
		{"statement pooler", testenv.WithQueryExecMode(stmtPooler.URL(name), "cache_describe"), inbox.ErrDatabaseUnfit, "statement"},
		{"no grants", noGrants.String(), inbox.ErrDatabaseUnfit, "INSERT on inbox"},
	} {
		pool, err := pgxpool.New(ctx, c.url)
		if err != nil {
			t.Fatal(err)
		}
		err = pginbox.New(pool).Check(ctx)
		pool.Close()
		switch {
		case c.want == nil && err != nil:
			t.Errorf("%s: Check = %v, want nil", c.name, err)
		case c.want != nil && (!errors.Is(err, c.want) || !strings.Contains(err.Error(), c.says)):
			t.Errorf("%s: Check = %v, want %v saying %q", c.name, err, c.want, c.says)
		}
	}
}
