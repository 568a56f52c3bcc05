// Package deploy holds no code: it is the home of jetinbox's deployment
// files (NATS server configs, stream and consumer definitions, PostgreSQL
// roles and settings, compose and Kubernetes manifests, Prometheus rules and
// a Grafana dashboard) and of the tests that validate them with the real
// parsers of the tools that run them, and run jetinbox's own producer and
// consumer under them. It is its own module so those parsers' dependencies
// stay out of jetinbox's; it uses the jetinbox of this checkout (replace
// ../ in go.mod).
//
//	cd deploy && go test ./...
package deploy
