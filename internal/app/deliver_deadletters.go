package app

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetinbox/jetinbox/delivery"
)

// Why a delivery was dead-lettered, as jetinbox_delivery_dead_letters_total
// labels it: "unknown" needs a human to ask the receiver whether the call
// took effect before anything is sent again; "refused" was answered with
// a permanent refusal (a 4xx, a redirect) and is re-driven after a fix.
const (
	deadUnknown = "unknown"
	deadRefused = "refused"
)

// deadLetterCounted wraps st so that every dead-letter the dispatcher
// records is counted by endpoint and reason on reg (the outcome counter
// of package metrics says "dead" for both reasons). Both series of every
// endpoint start at 0, so that an increase() sees the first one.
func deadLetterCounted(st delivery.Store, reg prometheus.Registerer, eps []delivery.Endpoint) (delivery.Store, error) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "jetinbox", Name: "delivery_dead_letters_total",
		Help: `Deliveries dead-lettered, by endpoint and reason: unknown ("outcome unknown: reconcile": no answer known and the receiver's key retention has passed; ask the receiver before re-driving) or refused (a permanent 4xx or a redirect; fix and re-drive).`},
		[]string{"endpoint", "reason"})
	if err := reg.Register(c); err != nil {
		return nil, err
	}
	for _, e := range eps {
		c.WithLabelValues(e.Name, deadUnknown)
		c.WithLabelValues(e.Name, deadRefused)
	}
	return &deadLetterStore{Store: st, dead: c, leased: map[int64]string{}}, nil
}

// deadLetterStore counts the dead-letters recorded through it. Record
// names a row by its ID alone, so the endpoint of each leased row is kept
// until its outcome is recorded.
type deadLetterStore struct {
	delivery.Store
	dead *prometheus.CounterVec

	mu     sync.Mutex
	leased map[int64]string
}

func (s *deadLetterStore) Lease(ctx context.Context, owner, endpoint string, n int, d time.Duration) ([]delivery.Delivery, error) {
	rows, err := s.Store.Lease(ctx, owner, endpoint, n, d)
	if len(rows) > 0 {
		s.mu.Lock()
		for _, r := range rows {
			s.leased[r.ID] = endpoint
		}
		s.mu.Unlock()
	}
	return rows, err
}

func (s *deadLetterStore) Record(ctx context.Context, owner string, id int64, r delivery.Result) error {
	err := s.Store.Record(ctx, owner, id, r)
	s.mu.Lock()
	endpoint, ok := s.leased[id]
	delete(s.leased, id)
	s.mu.Unlock()
	if err == nil && ok && r.State == delivery.StateDead {
		reason := deadRefused
		if strings.HasPrefix(r.Reason, "outcome unknown") {
			reason = deadUnknown
		}
		s.dead.WithLabelValues(endpoint, reason).Inc()
	}
	return err
}
