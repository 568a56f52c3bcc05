package deploy_test

import (
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	prommodel "github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/promql/promqltest"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/util/teststorage"

	"github.com/jetinbox/jetinbox/delivery"
	"github.com/jetinbox/jetinbox/delivery/pgdelivery"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

// deliverJob is the delivery dispatcher's scrape job in prometheus.yml.
const deliverJob = "jetinbox-deliver"

// deliverAlerts are the alerts on the dispatcher's metrics, each evaluated
// on its real /metrics by TestDeliverStackUnderItsRole.
var deliverAlerts = []string{"JetinboxDeliveryBacklogOld", "JetinboxDeliveryOutcomeUnknown", "JetinboxDeliveryRefused", "JetinboxDeliveryBreakerOpen", "JetinboxDeliverDown"}

// checkDeliverAlert: an alert on the dispatcher's metrics selects its job
// (every replica reports the database-wide backlog; other jobs export no
// such series), keeps the endpoint where it names one, and the backlog
// threshold pages before the shortest key retention of the shipped
// endpoints turns waiting rows into "outcome unknown".
func checkDeliverAlert(fsys files, alert string, expr parser.Expr, ms map[string]bool) error {
	var errs []string
	for m := range ms {
		if strings.HasPrefix(m, "jetinbox_delivery_") && !selectsJob(expr, m, deliverJob) {
			errs = append(errs, fmt.Sprintf("%s: must select %s{job=%q}, the dispatcher's scrape job", alert, m, deliverJob))
		}
	}
	if ms["jetinbox_delivery_dead_letters_total"] || ms["jetinbox_delivery_breaker_state"] {
		if !strings.Contains(expr.String(), "endpoint") {
			errs = append(errs, fmt.Sprintf("%s: aggregate by endpoint so the alert names it", alert))
		}
	}
	if ms["jetinbox_delivery_oldest_pending_seconds"] {
		eps, err := loadDeliverEndpoints(fsys)
		if err != nil {
			return err
		}
		for _, e := range eps {
			for _, n := range numbersIn(expr) {
				if ret := time.Duration(e.KeyRetention); ret > 0 && time.Duration(n*float64(time.Second)) >= ret/2 {
					errs = append(errs, fmt.Sprintf("%s: threshold %vs is not well below endpoint %s's key_retention %v: rows would go unknown before anyone is told", alert, n, e.Name, ret))
				}
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("prometheus/alerts.yml: %s", strings.Join(errs, "; "))
	}
	return nil
}

// TestDeliverStackUnderItsRole runs `jetinbox deliver` as the compose file
// declares it, literally (its command and environment; addresses and file
// paths moved to the test's servers and to the files cmd/devsecrets wrote,
// the endpoint's URL and CA to a TLS receiver here): a PostgreSQL server
// set up with roles.sql, `jetinbox migrate` (migrate), grants.sql
// (db-grants), deliver.sql and the role's password (deliver-db-setup);
// deliveries added as jetinbox_consumer, as `consumer -deliveries` does in
// its inbox transaction; then the dispatcher as jetinbox_deliver with the
// endpoints file and both signing secrets. The receiver checks that every
// request carries a valid signature by each secret and the key as
// Idempotency-Key and webhook-id.
//
// Then each JetinboxDeliver* alert of alerts.yml is evaluated with
// Prometheus's engine over the dispatcher's real /metrics, labelled as
// prometheus.yml's job: quiet while deliveries go through, firing when the
// receiver refuses (400), stops answering (503: the breaker opens), is
// down for longer than its key retention (rows dead-lettered "outcome
// unknown: reconcile"), when a delivery has waited an hour, and when the
// dispatcher is gone. Each alert's expression is also broken on purpose,
// and the broken one must give the wrong verdict on the same scrapes.
func TestDeliverStackUnderItsRole(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	began := time.Now()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	fsys := loadFiles(t)
	fx := fixture(t)
	p, err := loadCompose(fsys)
	if err != nil {
		t.Fatal(err)
	}
	job := scrapeJob(t, fsys, deliverTarget)
	work := t.TempDir()
	build := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(work, "bin")+"/", "./cmd/jetinbox")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	bin := filepath.Join(work, "bin", "jetinbox")
	t.Logf("built at %v", time.Since(began).Round(time.Millisecond))

	pg := startPostgres(t, fx)
	pg.superuser(t, "postgres", "CREATE DATABASE jetinbox")
	pg.superuserFile(t, "jetinbox", "postgres/roles.sql")
	password := func(role string) string {
		b, err := os.ReadFile(filepath.Join(fx.dir, "postgres", role+".password"))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	for _, role := range dbRoles {
		pg.superuser(t, "jetinbox", fmt.Sprintf("ALTER ROLE %s PASSWORD '%s'", role, password(role)))
	}

	// The receiver: TLS with a certificate of the development CA, which
	// the moved endpoints file names as its ca_file (TLS stays verified).
	var secrets [][]byte
	eps, err := loadDeliverEndpoints(fsys)
	if err != nil || len(eps) == 0 {
		t.Fatalf("%s: %v", deliverEndpointsFile, err)
	}
	wd, _ := filepath.Abs(".")
	secretFile := func(name string) string {
		s, ok := p.Secrets[name]
		if !ok {
			t.Fatalf("no compose secret %s", name)
		}
		rel, err := filepath.Rel(filepath.Join(wd, "secrets"), s.File)
		if err != nil || strings.HasPrefix(rel, "..") {
			t.Fatalf("compose secret %s is not under secrets/: %s", name, s.File)
		}
		return filepath.Join(fx.dir, rel)
	}
	for _, f := range eps[0].SecretFiles {
		b, err := os.ReadFile(secretFile(strings.TrimPrefix(f, "/run/jetinbox/")))
		if err != nil {
			t.Fatal(err)
		}
		s, err := delivery.ParseSecret(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatal(err)
		}
		secrets = append(secrets, s)
	}
	rc := newWebhookReceiver(t, fx, secrets)
	movedEndpoints := filepath.Join(work, "endpoints.json")
	{
		var raw []map[string]any
		b, _ := fsys.get(deliverEndpointsFile)
		if err := json.Unmarshal(b, &raw); err != nil {
			t.Fatal(err)
		}
		for _, e := range raw {
			u, _ := url.Parse(e["url"].(string))
			e["url"] = rc.url + u.Path
			e["ca_file"] = filepath.Join(fx.dir, "tls", "ca.pem")
			var files []string
			for _, f := range e["secret_files"].([]any) {
				files = append(files, secretFile(strings.TrimPrefix(f.(string), "/run/jetinbox/")))
			}
			e["secret_files"] = files
		}
		b, _ = json.Marshal(raw)
		if err := os.WriteFile(movedEndpoints, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}

	// A compose service's command and environment, moved here.
	addrs := map[string]string{}
	service := func(name string) (args, env []string) {
		t.Helper()
		s, ok := p.Services[name]
		if !ok {
			t.Fatalf("compose.yaml has no service %s", name)
		}
		if len(s.Entrypoint) != 1 || s.Entrypoint[0] != "/usr/local/bin/jetinbox" {
			t.Fatalf("%s: entrypoint %v, want /usr/local/bin/jetinbox", name, s.Entrypoint)
		}
		mountedFrom := map[string]string{}
		for _, v := range s.Volumes {
			mountedFrom[v.Target] = v.Source
		}
		for _, a := range s.Command {
			switch {
			case mountedFrom[a] == filepath.Join(wd, filepath.FromSlash(deliverEndpointsFile)):
				a = movedEndpoints
			case strings.HasPrefix(a, "0.0.0.0:"):
				if addrs[a] == "" {
					addrs[a] = readmeFreeAddr(t)
				}
				a = addrs[a]
			}
			args = append(args, a)
		}
		for _, kv := range os.Environ() {
			k, _, _ := strings.Cut(kv, "=")
			if !strings.HasPrefix(k, "NATS_") && !strings.HasPrefix(k, "PG") && !strings.HasPrefix(k, "JETINBOX_") && k != "DATABASE_URL" {
				env = append(env, kv)
			}
		}
		env = append(env, "JETINBOX_LOG_FORMAT=text")
		var role string
		for k, v := range s.Environment {
			val := *v
			switch k {
			case "DATABASE_URL":
				u, err := url.Parse(val)
				if err != nil || u.User == nil {
					t.Fatalf("%s: DATABASE_URL %q", name, val)
				}
				role = u.User.Username()
				u.Host = fmt.Sprintf("localhost:%d", pg.port)
				q := u.Query()
				q.Set("sslrootcert", pg.ca)
				u.RawQuery = q.Encode()
				val = u.String()
			case "PGPASSFILE":
				continue
			default:
				if strings.HasPrefix(val, "/run/jetinbox/") {
					val = secretFile(strings.TrimPrefix(val, "/run/jetinbox/"))
				}
			}
			env = append(env, k+"="+val)
		}
		if role != "" {
			f := filepath.Join(work, name+".pgpass")
			if err := os.WriteFile(f, fmt.Appendf(nil, "localhost:%d:jetinbox:%s:%s\n", pg.port, role, password(role)), 0o600); err != nil {
				t.Fatal(err)
			}
			env = append(env, "PGPASSFILE="+f)
		}
		return args, env
	}

	// migrate, db-grants, deliver-db-setup.
	args, env := service("migrate")
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = env
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("migrate: %v\n%s", err, out)
	}
	pg.as("jetinbox_migrator", password("jetinbox_migrator")).mustFile(t, "postgres/grants.sql")
	if !waitedFor(p.Services["deliver-db-setup"], "db-grants") {
		t.Fatal("deliver-db-setup does not wait for db-grants")
	}
	pg.superuserFile(t, "jetinbox", "postgres/deliver.sql")
	b, err := os.ReadFile(secretFile("jetinbox_deliver_password"))
	if err != nil {
		t.Fatal(err)
	}
	pg.superuser(t, "jetinbox", fmt.Sprintf("ALTER ROLE jetinbox_deliver PASSWORD '%s'", strings.TrimSpace(string(b))))

	consumer, err := pgxpool.New(ctx, fmt.Sprintf("postgres://jetinbox_consumer:%s@localhost:%d/jetinbox?sslmode=verify-full&sslrootcert=%s",
		url.QueryEscape(password("jetinbox_consumer")), pg.port, url.QueryEscape(pg.ca)))
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	endpoint := eps[0].Name
	add := func(prefix string, n int) {
		t.Helper()
		var ins []delivery.Intent
		for i := range n {
			ins = append(ins, delivery.Intent{Scope: "ledger", MessageID: fmt.Sprintf("%s-%d", prefix, i), Endpoint: endpoint, Payload: fmt.Appendf(nil, `{"n":%d}`, i)})
		}
		tx, err := consumer.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck // after Commit
		if err := pgdelivery.Add(ctx, tx, ins...); err != nil {
			t.Fatalf("Add as jetinbox_consumer: %v", err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}

	t.Logf("migrated, roles set at %v", time.Since(began).Round(time.Millisecond))
	// deliver.
	args, env = service("deliver")
	metricsAddr := addrs["0.0.0.0:"+deliverTarget[strings.LastIndex(deliverTarget, ":")+1:]]
	if metricsAddr == "" {
		t.Fatalf("deliver's command does not serve -http on the port prometheus.yml scrapes: %v", p.Services["deliver"].Command)
	}
	out := &testenv.SyncBuffer{}
	proc := exec.Command(bin, args...)
	proc.Env, proc.Stdout, proc.Stderr = env, out, out
	if err := proc.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- proc.Wait() }()
	t.Cleanup(func() { _ = proc.Process.Kill() })
	alive := func() {
		t.Helper()
		select {
		case err := <-waited:
			t.Fatalf("deliver exited: %v\n%s", err, lastOutputLines(out.String(), 20))
		default:
		}
	}
	page := "http://" + metricsAddr + "/metrics"
	scrape := func() map[string]float64 {
		t.Helper()
		s := scrapeSeries(t, page, job, deliverTarget)
		s[fmt.Sprintf("up{job=%q,instance=%q}", job, deliverTarget)] = 1
		return s
	}
	series := func(s map[string]float64, name string, labels ...string) float64 {
		ls := []string{fmt.Sprintf("job=%q", job), fmt.Sprintf("instance=%q", deliverTarget)}
		for i := 0; i+1 < len(labels); i += 2 {
			ls = append(ls, fmt.Sprintf("%s=%q", labels[i], labels[i+1]))
		}
		return s[fmt.Sprintf("%s{%s}", name, strings.Join(ls, ","))]
	}
	eventually(t, ctx, func() error {
		alive()
		return httpOK("http://" + metricsAddr + "/healthz")
	})

	// settled waits until no delivery is pending and every dead one is
	// counted (the count follows the recorded outcome), and returns that
	// scrape.
	settled := func() map[string]float64 {
		t.Helper()
		var s map[string]float64
		// The count follows the commit of the outcome by microseconds; a
		// count still short half a minute after nothing is pending is
		// wrong, not late.
		var short time.Time
		eventually(t, ctx, func() error {
			alive()
			var pending, dead int
			if err := consumer.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state = 'pending'), count(*) FILTER (WHERE state = 'dead') FROM deliveries`).Scan(&pending, &dead); err != nil {
				return err
			}
			s = scrape()
			for _, reason := range []string{"unknown", "refused"} {
				if _, ok := s[fmt.Sprintf("jetinbox_delivery_dead_letters_total{job=%q,instance=%q,endpoint=%q,reason=%q}", job, deliverTarget, endpoint, reason)]; !ok {
					t.Fatalf("/metrics has no dead_letters_total{endpoint=%q, reason=%q} (every endpoint's series start at 0)", endpoint, reason)
				}
			}
			counted := series(s, "jetinbox_delivery_dead_letters_total", "endpoint", endpoint, "reason", "unknown") +
				series(s, "jetinbox_delivery_dead_letters_total", "endpoint", endpoint, "reason", "refused")
			if pending == 0 && float64(dead) != counted {
				if short.IsZero() {
					short = time.Now()
				} else if time.Since(short) > 30*time.Second {
					t.Fatalf("nothing pending, %d deliveries dead, %v dead-letters counted", dead, counted)
				}
			}
			if pending > 0 || float64(dead) != counted || series(s, "jetinbox_delivery_pending_rows") != 0 {
				return fmt.Errorf("%d deliveries pending, %d dead, %v dead-letters counted", pending, dead, counted)
			}
			return nil
		})
		return s
	}

	// 1. Delivered, signed with both secrets, under the key.
	add("ok", 3)
	eventually(t, ctx, func() error {
		alive()
		if n := rc.verified.Load(); n < 3 {
			return fmt.Errorf("%d of 3 delivered with valid signatures (bad: %v)", n, rc.bad())
		}
		return nil
	})
	if bad := rc.bad(); len(bad) > 0 {
		t.Fatalf("the receiver saw requests it could not verify: %v", bad)
	}
	var quiet map[string]float64
	eventually(t, ctx, func() error {
		alive()
		// The outcome is counted once recorded, after the answer.
		quiet = scrape()
		if got := series(quiet, "jetinbox_delivery_attempts_total", "endpoint", endpoint, "outcome", "delivered"); got != 3 {
			return fmt.Errorf("jetinbox_delivery_attempts_total{outcome=delivered} %v, want 3", got)
		}
		return nil
	})
	t.Logf("delivered, signed with %d secrets, at %v", len(secrets), time.Since(began).Round(time.Millisecond))
	// Every dispatcher metric the alerts and the dashboard name is one the
	// binary exports.
	{
		resp, err := http.Get(page)
		if err != nil {
			t.Fatal(err)
		}
		text, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		problems, err := promlint.New(strings.NewReader(string(text))).Lint()
		if err != nil || len(problems) > 0 {
			t.Errorf("jetinbox deliver's /metrics: %v %v", problems, err)
		}
		for _, f := range []string{"prometheus/alerts.yml", "grafana/jetinbox-dashboard.json"} {
			b, _ := fsys.get(f)
			for _, m := range regexp.MustCompile(`jetinbox_delivery_[a-z_]+`).FindAllString(string(b), -1) {
				name := strings.TrimSuffix(strings.TrimSuffix(m, "_bucket"), "_count")
				if !strings.Contains(string(text), "# TYPE "+name+" ") {
					t.Fatalf("%s names %s, which jetinbox deliver does not export", f, m)
				}
			}
		}
	}

	// 2. Refused for good: 400.
	rc.status.Store(http.StatusBadRequest)
	add("refused", 3)
	refused := settled()
	if got := series(refused, "jetinbox_delivery_dead_letters_total", "endpoint", endpoint, "reason", "refused"); got != 3 {
		t.Fatalf("3 deliveries refused (400): dead_letters_total{reason=refused} %v, want 3", got)
	}

	t.Logf("refused at %v", time.Since(began).Round(time.Millisecond))
	// 3. No answer: 503 until the breaker opens; a delivery waits.
	rc.status.Store(http.StatusServiceUnavailable)
	add("down", 6)
	var open map[string]float64
	eventually(t, ctx, func() error {
		alive()
		open = scrape()
		if got := series(open, "jetinbox_delivery_breaker_state", "endpoint", endpoint); got == 0 {
			return fmt.Errorf("breaker still closed (%d calls answered 503)", rc.unavailable.Load())
		}
		return nil
	})
	t.Logf("breaker open at %v", time.Since(began).Round(time.Millisecond))
	superuser := func(sql string) { t.Helper(); pg.superuser(t, "jetinbox", sql) }
	// The waiting deliveries were decided an hour ago: the backlog alert.
	superuser(`UPDATE jetinbox.deliveries SET created_at = now() - interval '1 hour' WHERE state = 'pending'`)
	old := scrape()
	if got := series(old, "jetinbox_delivery_oldest_pending_seconds"); got < 3600 {
		t.Fatalf("jetinbox_delivery_oldest_pending_seconds %v after the pending rows were dated an hour back", got)
	}
	// 4. ... and first tried longer ago than the receiver keeps keys: their
	// next attempt dead-letters them "outcome unknown: reconcile" without
	// a call. They are due in 3 s; a fresh delivery, due now and
	// answered, closes the breaker before (while half-open, the
	// dispatcher takes one row a second).
	superuser(`UPDATE jetinbox.deliveries SET first_attempt_at = now() - interval '25 hours', next_at = now() + interval '3 seconds' WHERE state = 'pending'`)
	rc.status.Store(http.StatusOK)
	add("back", 1)
	unknown := settled()
	var dead int
	if err := consumer.QueryRow(ctx, `SELECT count(*) FROM deliveries WHERE state = 'dead' AND reason LIKE 'outcome unknown: reconcile%'`).Scan(&dead); err != nil || dead == 0 || float64(dead) != series(unknown, "jetinbox_delivery_dead_letters_total", "endpoint", endpoint, "reason", "unknown") {
		t.Fatalf("%d rows dead-lettered 'outcome unknown: reconcile' (%v), dead_letters_total{reason=unknown} says %v", dead, err, series(unknown, "jetinbox_delivery_dead_letters_total", "endpoint", endpoint, "reason", "unknown"))
	}
	if got := series(unknown, "jetinbox_delivery_breaker_state", "endpoint", endpoint); got != 0 {
		t.Fatalf("the breaker did not close after an answered delivery: state %v", got)
	}

	t.Logf("outcome unknown at %v", time.Since(began).Round(time.Millisecond))
	// 5. Gone: SIGTERM, exit 0; the scrape fails.
	if err := proc.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-waited:
		if err != nil {
			t.Fatalf("deliver after SIGTERM: %v\n%s", err, lastOutputLines(out.String(), 20))
		}
	case <-ctx.Done():
		t.Fatal("deliver did not stop after SIGTERM")
	}
	if strings.Contains(out.String(), "permission denied") {
		t.Fatalf("deliver was refused under its role:\n%s", lastOutputLines(out.String(), 20))
	}
	down := map[string]float64{fmt.Sprintf("up{job=%q,instance=%q}", job, deliverTarget): 0}
	if httpOK("http://"+metricsAddr+"/healthz") == nil {
		t.Fatal("deliver still answers after it exited")
	}

	t.Logf("every case scraped at %v", time.Since(began).Round(time.Millisecond))
	// The alerts, each over the scrapes a minute apart that Prometheus
	// would have stored, and each broken on purpose.
	repeat := func(s map[string]float64, n int) []map[string]float64 {
		out := make([]map[string]float64, n)
		for i := range out {
			out[i] = s
		}
		return out
	}
	type verdict struct {
		what    string
		scrapes []map[string]float64
		fires   bool
		// step between scrapes; default a minute.
		step time.Duration
	}
	for _, a := range []struct {
		alert    string
		verdicts []verdict
		// mutations of the expression that must get a verdict wrong.
		mutations [][2]string
	}{
		{"JetinboxDeliveryBacklogOld", []verdict{
			{"deliveries going through", []map[string]float64{quiet}, false, 0},
			{"a receiver answering 503 for seconds", []map[string]float64{open}, false, 0},
			{"a delivery waiting an hour", []map[string]float64{old}, true, 0},
		}, [][2]string{{"> 1800", "> 7200"}, {"jetinbox_delivery_oldest_pending_seconds", "jetinbox_delivery_pending_rows"}, {`job="jetinbox-deliver"`, `job="jetinbox-consumer"`}}},
		{"JetinboxDeliveryOutcomeUnknown", []verdict{
			{"deliveries going through", []map[string]float64{quiet, quiet}, false, 0},
			{"deliveries refused", []map[string]float64{quiet, refused}, false, 0},
			{"deliveries past the key retention", []map[string]float64{quiet, unknown}, true, 0},
			// The page stays a day, then ends: the rows stay dead until
			// someone re-drives them, which is no reason to page for ever.
			{what: "the same a day later", scrapes: append(repeat(quiet, 1), repeat(unknown, 26)...), step: time.Hour},
		}, [][2]string{{`reason="unknown"`, `reason="refused"`}, {"[24h]", "[1m]"}, {"[24h]", "[30d]"}, {"> 0", "> 10"}}},
		{"JetinboxDeliveryRefused", []verdict{
			{"deliveries going through", []map[string]float64{quiet, quiet}, false, 0},
			{"deliveries refused", []map[string]float64{quiet, refused}, true, 0},
			{"deliveries past the key retention", []map[string]float64{refused, unknown}, false, 0},
		}, [][2]string{{`reason="refused"`, `reason="unknown"`}, {"> 0.05 *", "> 5 *"}}},
		{"JetinboxDeliveryBreakerOpen", []verdict{
			{"deliveries going through", repeat(quiet, 17), false, 0},
			{"a breaker not closed for 15 minutes", append(repeat(quiet, 2), repeat(open, 15)...), true, 0},
			{"a breaker not closed for 14 minutes", append(repeat(quiet, 3), repeat(open, 14)...), false, 0},
			{"a breaker closed again", append(repeat(open, 16), unknown), false, 0},
		}, [][2]string{{"min_over_time", "max_over_time"}, {"[15m]", "[1m]"}, {"> 0", "> 5"}}},
		{"JetinboxDeliverDown", []verdict{
			{"a dispatcher running", []map[string]float64{unknown}, false, 0},
			{"a dispatcher gone", []map[string]float64{unknown, down}, true, 0},
		}, [][2]string{{`job="jetinbox-deliver"`, `job="jetinbox-consumer"`}, {"== 0", "== 1"}}},
	} {
		expr := alertExpr(t, fsys, a.alert)
		exprs := []string{expr}
		for _, m := range a.mutations {
			if !strings.Contains(expr, m[0]) {
				t.Errorf("%s: mutation %q no longer applies to %s", a.alert, m[0], expr)
			}
			exprs = append(exprs, strings.Replace(expr, m[0], m[1], 1))
		}
		// wrong[i]: the cases exprs[i] judges wrong. One storage per case
		// for the expression and its mutations.
		wrong := make([][]string, len(exprs))
		for _, v := range a.verdicts {
			step := cmp.Or(v.step, time.Minute)
			storage := loadScrapes(t, step, selected(v.scrapes))
			for i, e := range exprs {
				got := evalAt(t, ctx, storage, e, time.Unix(0, 0).Add(step*time.Duration(len(v.scrapes)-1)))
				if fired := len(got) > 0; fired != v.fires {
					wrong[i] = append(wrong[i], fmt.Sprintf("%s: fired %v (%v), want %v", v.what, fired, got, v.fires))
				} else if fired && !oneDeliverSample(got, job, endpoint) {
					wrong[i] = append(wrong[i], fmt.Sprintf("%s: %v, want one sample of job %q (and endpoint %q where it keeps one)", v.what, got, job, endpoint))
				}
			}
			storage.Close()
		}
		if len(wrong[0]) > 0 {
			t.Errorf("%s = %s:\n  %s", a.alert, expr, strings.Join(wrong[0], "\n  "))
		}
		for i, m := range a.mutations {
			if len(wrong[i+1]) == 0 {
				t.Errorf("%s with %q → %q still judges every case right: the cases do not test it", a.alert, m[0], m[1])
			}
		}
	}
	t.Logf("alerts judged at %v", time.Since(began).Round(time.Millisecond))
	if !slices.Equal(deliverAlerts, []string{"JetinboxDeliveryBacklogOld", "JetinboxDeliveryOutcomeUnknown", "JetinboxDeliveryRefused", "JetinboxDeliveryBreakerOpen", "JetinboxDeliverDown"}) {
		t.Fatal("deliverAlerts changed: evaluate the new ones here")
	}
}

// selected returns the scrapes with only the dispatcher's own series and
// up: fewer series to load.
func selected(scrapes []map[string]float64) []map[string]float64 {
	out := make([]map[string]float64, len(scrapes))
	for i, s := range scrapes {
		out[i] = map[string]float64{}
		for k, v := range s {
			name, _, _ := strings.Cut(k, "{")
			if strings.HasPrefix(name, "jetinbox_delivery_") || name == "up" {
				out[i][k] = v
			}
		}
	}
	return out
}

// oneDeliverSample reports whether v is one sample of job, of endpoint if
// it keeps the label.
func oneDeliverSample(v promql.Vector, job, endpoint string) bool {
	if len(v) != 1 || v[0].Metric.Get("job") != job {
		return false
	}
	e := v[0].Metric.Get("endpoint")
	return e == "" || e == endpoint
}

// webhookReceiver answers with status (200 unless set), after checking
// each request as a Standard Webhooks receiver would with every secret.
type webhookReceiver struct {
	url                   string
	secrets               [][]byte
	status                atomic.Int64
	verified, unavailable atomic.Int64
	mu                    sync.Mutex
	problems              []string
}

func (r *webhookReceiver) bad() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.problems)
}

func newWebhookReceiver(t *testing.T, fx *secretsFixture, secrets [][]byte) *webhookReceiver {
	t.Helper()
	r := &webhookReceiver{secrets: secrets}
	r.status.Store(http.StatusOK)
	cert, err := tls.LoadX509KeyPair(filepath.Join(fx.dir, "tls", "intake.pem"), filepath.Join(fx.dir, "tls", "intake-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(req.Body, 1<<20))
		id, ts := req.Header.Get("webhook-id"), req.Header.Get("webhook-timestamp")
		var problem string
		sigs := strings.Fields(req.Header.Get("webhook-signature"))
		for i, s := range r.secrets {
			h := hmac.New(sha256.New, s)
			fmt.Fprintf(h, "%s.%s.", id, ts)
			h.Write(body)
			if !slices.Contains(sigs, "v1,"+base64.StdEncoding.EncodeToString(h.Sum(nil))) {
				problem = fmt.Sprintf("no valid signature by secret %d in %q", i+1, sigs)
			}
		}
		if sec, err := strconv.ParseInt(ts, 10, 64); err != nil || time.Since(time.Unix(sec, 0)).Abs() > 5*time.Minute {
			problem = fmt.Sprintf("webhook-timestamp %q", ts)
		}
		if id == "" || req.Header.Get("Idempotency-Key") != `"`+id+`"` {
			problem = fmt.Sprintf("Idempotency-Key %q, webhook-id %q", req.Header.Get("Idempotency-Key"), id)
		}
		if problem != "" {
			r.mu.Lock()
			r.problems = append(r.problems, problem)
			r.mu.Unlock()
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		status := int(r.status.Load())
		switch status {
		case http.StatusOK:
			r.verified.Add(1)
		case http.StatusServiceUnavailable:
			r.unavailable.Add(1)
		}
		w.WriteHeader(status)
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	r.url = "https://localhost:" + srv.Listener.Addr().String()[strings.LastIndex(srv.Listener.Addr().String(), ":")+1:]
	return r
}

// loadScrapes stores scrapes step apart, from time 0, as evalScrapes does.
func loadScrapes(t *testing.T, step time.Duration, scrapes []map[string]float64) *teststorage.TestStorage {
	t.Helper()
	last := scrapes[len(scrapes)-1]
	var load strings.Builder
	fmt.Fprintf(&load, "load %s\n", prommodel.Duration(step))
	for s := range last {
		fmt.Fprintf(&load, "  %s", s)
		for _, sc := range scrapes {
			fmt.Fprintf(&load, " %v", sc[s])
		}
		load.WriteString("\n")
	}
	return promqltest.LoadedStorage(t, load.String())
}

// evalAt evaluates expr over storage at the time at.
func evalAt(t *testing.T, ctx context.Context, storage storage.Queryable, expr string, at time.Time) promql.Vector {
	t.Helper()
	engine := promqltest.NewTestEngine(t, false, 0, promqltest.DefaultMaxSamplesPerQuery)
	q, err := engine.NewInstantQuery(ctx, storage, nil, expr, at)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	res := q.Exec(ctx)
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	vec, err := res.Vector()
	if err != nil {
		t.Fatal(err)
	}
	return vec
}
