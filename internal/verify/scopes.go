// Scopes with inbox rows, for the warning about a likely wrong -scope.

package verify

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Scopes returns up to limit scopes that have inbox rows, in order, with an
// index skip scan over the primary key: cheap on a large inbox.
func Scopes(ctx context.Context, pool *pgxpool.Pool, limit int) ([]string, error) {
	return ScopesOn(ctx, Postgres(pool), limit)
}

// ScopesOn is [Scopes] on any store's database. SQLite skips through the
// primary key on its own (a skip-scan of DISTINCT).
func ScopesOn(ctx context.Context, db DB, limit int) ([]string, error) {
	rows, err := db.query(ctx, stmt{`WITH RECURSIVE s(scope) AS (
	(SELECT scope FROM inbox ORDER BY scope LIMIT 1)
	UNION ALL
	SELECT (SELECT i.scope FROM inbox i WHERE i.scope > s.scope ORDER BY i.scope LIMIT 1) FROM s WHERE s.scope IS NOT NULL
)
SELECT scope FROM s WHERE scope IS NOT NULL LIMIT $1`, `SELECT DISTINCT scope FROM inbox ORDER BY scope LIMIT ?1`}, limit)
	if err != nil {
		return nil, fmt.Errorf("verify: inbox scopes: %w", err)
	}
	defer rows.Close()
	var scopes []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, fmt.Errorf("verify: inbox scopes: %w", err)
		}
		scopes = append(scopes, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("verify: inbox scopes: %w", err)
	}
	return scopes, nil
}

// NoRowsWarning says that scope has no inbox rows at all while the stream
// has n messages to judge, and names the scopes that do have rows.
func NoRowsWarning(scope string, n int, scopes []string) string {
	if len(scopes) == 0 {
		return fmt.Sprintf("the inbox has no rows at all, yet the stream has %d messages here: nothing consumed them into this database (is DATABASE_URL the consumer's?)", n)
	}
	q := make([]string, len(scopes))
	for i, s := range scopes {
		q[i] = strconv.Quote(s)
	}
	return fmt.Sprintf("scope %q has no inbox rows at all, yet the stream has %d messages here: -scope (JETINBOX_SCOPE) is likely wrong; scopes with rows: %s",
		scope, n, strings.Join(q, ", "))
}
