package sqlitedelivery

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/jetinbox/jetinbox/delivery"
	"github.com/jetinbox/jetinbox/inbox"
)

// Routed returns h with deliveries: every message h applies whose subject
// routes matches is also delivered, its payload as it is, to each endpoint
// the route names: a delivery row added in the same inbox transaction (so
// it exists if and only if the effect committed). The scope is the
// processor's (inbox.ScopeFromContext).
func Routed(h inbox.Handler[*sql.Tx], routes delivery.Routes) inbox.Handler[*sql.Tx] {
	return routed{h: h, routes: routes}
}

type routed struct {
	h      inbox.Handler[*sql.Tx]
	routes delivery.Routes
}

func (r routed) Handle(ctx context.Context, tx *sql.Tx, msgs []inbox.Message, errs []error) error {
	if err := r.h.Handle(ctx, tx, msgs, errs); err != nil {
		return err
	}
	scope, _ := inbox.ScopeFromContext(ctx)
	var ins []delivery.Intent
	for i, m := range msgs {
		if errs[i] != nil {
			continue
		}
		for _, ep := range r.routes.Match(m.Subject) {
			ins = append(ins, delivery.Intent{Scope: scope, MessageID: m.ID, Endpoint: ep, Payload: m.Payload})
		}
	}
	if err := Add(ctx, tx, ins...); err != nil {
		return fmt.Errorf("delivery: routed: %w", err)
	}
	return nil
}
