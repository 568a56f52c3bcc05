package console

import (
	"context"
	"fmt"
	"time"

	"github.com/jetinbox/jetinbox/delivery"
	"github.com/jetinbox/jetinbox/delivery/pgdelivery"
	"github.com/jetinbox/jetinbox/delivery/sqlitedelivery"
)

// outgoingHop reads the calls the intent's effect decided to make to other
// services (the deliveries table, `jetinbox deliver`): per endpoint, its
// stable key, where it stands and the receiver's last answer. A database
// without the table has none; the payload and the answer's body are not
// read (the verifier's role may not).
func outgoingHop(ctx context.Context, s *Sources, q *Query) ([]Fact, error) {
	return eachDB(ctx, s, func(d db, where string) ([]Fact, error) {
		var out []Fact
		for _, id := range q.IDs {
			rows, done, err := d.query(ctx, `SELECT endpoint, idem_key, state, attempts, coalesce(last_status, 0), coalesce(reason, ''), created_at, last_at
FROM deliveries WHERE scope = $1 AND message_id = $2 ORDER BY id LIMIT 20`, s.Scope, id)
			if err != nil {
				return out, err
			}
			for rows.Next() {
				var endpoint, key, state, reason string
				var attempts, status int
				var created, last any
				if err := rows.Scan(&endpoint, &key, &state, &attempts, &status, &reason, &created, &last); err != nil {
					done()
					return out, err
				}
				out = append(out, outgoingFact(where, endpoint, key, delivery.State(state), attempts, status, reason, when(created), when(last)))
			}
			err = rows.Err()
			done()
			if err != nil {
				return out, err
			}
		}
		return out, nil
	})
}

func outgoingFact(where, endpoint, key string, state delivery.State, attempts, status int, reason string, created, last time.Time) Fact {
	f := Fact{At: created, Source: "table deliveries" + where}
	call := fmt.Sprintf("call to %s under Idempotency-Key %s", Safe([]byte(endpoint), 200), Safe([]byte(key), 300))
	answer := ""
	if status != 0 {
		answer = fmt.Sprintf(", last answer %d at %s", status, fmtTime(last))
	}
	switch state {
	case delivery.StateDelivered:
		f.Level, f.What = "ok", fmt.Sprintf("%s: delivered after %d attempt(s)%s", call, attempts, answer)
	case delivery.StateDead:
		f.Level, f.What = "bad", fmt.Sprintf("%s: dead-lettered after %d attempt(s) because %s%s (jetinbox dlq -deliveries)", call, attempts, Safe([]byte(reason), 1000), answer)
	default:
		f.Level, f.What = "info", fmt.Sprintf("%s: pending, %d attempt(s) so far%s", call, attempts, answer)
	}
	return f
}

// deliveryBacklog says how many outgoing calls wait and the oldest's age,
// through the store the dispatcher uses; "" where no database has the table.
func deliveryBacklog(ctx context.Context, s *Sources) (string, error) {
	var msg string
	for _, sd := range s.DBs {
		var backlog func(context.Context) (int64, time.Duration, error)
		switch {
		case sd.PG != nil:
			backlog = pgdelivery.New(sd.PG).Backlog
		case sd.SQLite != nil:
			backlog = sqlitedelivery.New(sd.SQLite).Backlog
		default:
			continue
		}
		n, age, err := backlog(ctx)
		switch {
		case missingTable(err):
			continue
		case err != nil:
			return msg, err
		}
		name := ""
		if sd.Name != "" {
			name = sd.Name + ": "
		}
		msg += fmt.Sprintf("%s%d pending calls, oldest %s old. ", name, n, age.Round(time.Second))
	}
	return msg, nil
}
