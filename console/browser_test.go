package console_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/console"
	"github.com/jetinbox/jetinbox/idempotency/pgidempotency"
	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/dlq"
	"github.com/jetinbox/jetinbox/internal/intake"
	"github.com/jetinbox/jetinbox/internal/pipeline"
	"github.com/jetinbox/jetinbox/internal/pipelinetest"
	"github.com/jetinbox/jetinbox/outbox"
)

const (
	tenantToken   = "acme-tenant-token-0123456789"
	httpKey       = "order-8812"
	operatorToken = "console-test-operator-token"
	window        = 500 * time.Millisecond
	// The hostile payload: run, it would set the title and a global.
	xssPayload = `<script>document.title="pwned";window.__pwned=1</script><img src=x onerror="window.__pwned=2">` + "\xff\xfe\u202e"
)

// rig is one running pipeline (embedded NATS, a throwaway PostgreSQL, the
// project's consumer and publisher) with the console in front of it,
// shared by every subtest.
type rig struct {
	e    *pipelinetest.Env
	srv  *httptest.Server
	base string // the console's URL, ending in /
	seq  map[string]uint64
}

func newRig(t *testing.T) *rig {
	t.Helper()
	ctx := context.Background()
	e := pipelinetest.New(t, jsinbox.StreamConfig{DuplicateWindow: window}, 10)
	env := func(k string) string {
		return map[string]string{"NATS_URL": e.NATS.URL(), "DATABASE_URL": e.DBURL}[k]
	}
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- cli.Consumer(cctx, []string{"-http", ""}, env, io.Discard, io.Discard) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("consumer: %v", err)
		}
	})
	pub, err := jsinbox.NewPublisher(e.JS, jsinbox.PublisherConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	for _, in := range []inbox.Intent{
		{ID: "ok-1", Subject: "intents.1", Payload: []byte(`{"account":1,"amount":5}`)},
		{ID: "to-999", Subject: "intents.1", Payload: []byte(`{"account":999,"amount":42}`)},
		{ID: "xss", Subject: "intents.1", Payload: []byte(xssPayload)},
		{ID: "dup-1", Subject: "intents.2", Payload: []byte(`{"account":2,"amount":7}`)},
		{ID: "conf-1", Subject: "intents.3", Payload: []byte(`{"account":3,"amount":1}`)},
	} {
		if _, err := pub.Publish(ctx, in); err != nil {
			t.Fatal(err)
		}
	}
	// dup-1 again after the duplicate window: a second stream message the
	// inbox settles as a duplicate.
	time.Sleep(window + 200*time.Millisecond)
	for _, in := range []inbox.Intent{
		{ID: "dup-1", Subject: "intents.2", Payload: []byte(`{"account":2,"amount":7}`)},
		{ID: "conf-1", Subject: "intents.3", Payload: []byte(`{"account":3,"amount":1000}`)}, // another payload: a conflict
	} {
		if _, err := e.JS.PublishMsg(ctx, &nats.Msg{Subject: in.Subject, Data: in.Payload, Header: nats.Header{jetstream.MsgIDHeader: {in.ID}}}); err != nil {
			t.Fatal(err)
		}
	}
	store, err := cli.OpenStore(ctx, e.DBURL, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)

	// The first hop over HTTP: jetinbox intake's server takes an intent
	// under an Idempotency-Key (twice: the retry replays), its relay
	// publishes the outbox row into the stream.
	if _, err := store.Outbox().Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pgidempotency.New(e.Pool).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	in, err := intake.NewPG(e.Pool, intake.Config{Tenants: []intake.Tenant{{Name: "acme", TokenSHA256: intake.HashToken(tenantToken)}}, SubjectPrefix: "intents."})
	if err != nil {
		t.Fatal(err)
	}
	ins := httptest.NewServer(in)
	t.Cleanup(ins.Close)
	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, ins.URL+intake.Route, strings.NewReader(`{"subject": "intents.4", "payload": {"account": 4, "amount": 3}}`))
		req.Header.Set("Authorization", "Bearer "+tenantToken)
		req.Header.Set("Idempotency-Key", httpKey)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusAccepted {
			t.Fatalf("intake: %d %s", res.StatusCode, b)
		}
	}
	rctx, rcancel := context.WithCancel(ctx)
	_, rdone, err := cli.StartRelay(rctx, store, e.JS, outbox.RelayConfig{Stream: jsinbox.DefaultStream})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rcancel(); <-rdone })
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		var pending int
		if err := e.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE sent_at IS NULL`).Scan(&pending); err != nil {
			t.Fatal(err)
		}
		if pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the relay never published the intake's outbox row")
		}
	}
	settle(t, e.JS)
	h, err := console.New(console.Config{Prefix: "/console", JS: e.JS, ReadPG: e.Pool, OperatorToken: operatorToken,
		Redrive: &console.Redrive{JS: e.JS, Store: store}})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/console/", h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	r := &rig{e: e, srv: srv, base: srv.URL + "/console/", seq: map[string]uint64{}}
	dead, err := dlq.Read(ctx, e.JS, jsinbox.DefaultStream, "ledger")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dead {
		r.seq[d.ID] = d.Seq
	}
	if r.seq["to-999"] == 0 || r.seq["xss"] == 0 {
		t.Fatalf("dead letters %v: want to-999 and xss", r.seq)
	}
	return r
}

func settle(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := pipeline.WaitSettled(ctx, js, jsinbox.DefaultStream, "ledger", nil); err != nil {
		t.Fatal(err)
	}
}

// needChromium fails under CI=true when Chromium is missing, and skips
// elsewhere.
func needChromium(t *testing.T) {
	t.Helper()
	if console.ChromiumPath() != "" {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatal("chromium is not installed (apt-get install chromium; .ci/run installs it)")
	}
	t.Skip("chromium is not installed")
}

// TestConsole runs the console on a running pipeline and drives it with
// plain HTTP and with headless Chromium: every page, the CSP, a lookup of
// an applied, a dead-lettered and a duplicated ID, a hostile payload that
// must not run, refused actions, a forged dead letter refused, and a
// re-drive through the pages that ends applied.
func TestConsole(t *testing.T) {
	needChromium(t)
	r := newRig(t)

	t.Run("CSP", func(t *testing.T) {
		for _, p := range []string{"", "intent?id=ok-1", "dlq", fmt.Sprintf("dlq/show?seq=%d", r.seq["xss"]), "verify?run=1", "partitions", "login", "charts", "static/console.js", "nope"} {
			res, err := http.Get(r.base + p)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if got := res.Header.Get("Content-Security-Policy"); got != console.CSP {
				t.Errorf("%s: Content-Security-Policy %q, want %q", p, got, console.CSP)
			}
			if res.Header.Get("X-Frame-Options") != "DENY" || res.Header.Get("X-Content-Type-Options") != "nosniff" {
				t.Errorf("%s: framing or sniffing not refused: %v", p, res.Header)
			}
		}
	})

	t.Run("ActionsRefused", func(t *testing.T) {
		form := url.Values{"seq": {fmt.Sprint(r.seq["to-999"])}, "confirm": {"yes"}}
		// No credential at all.
		if res := post(t, http.DefaultClient, r.base+"dlq/redrive", form); res != http.StatusUnauthorized {
			t.Errorf("re-drive without a session: %d, want 401", res)
		}
		c := login(t, r.base)
		// A session, but no CSRF token, and a wrong one.
		if res := post(t, c, r.base+"dlq/redrive", form); res != http.StatusForbidden {
			t.Errorf("re-drive without a CSRF token: %d, want 403", res)
		}
		form.Set("csrf", strings.Repeat("0", 64))
		if res := post(t, c, r.base+"dlq/redrive", form); res != http.StatusForbidden {
			t.Errorf("re-drive with a wrong CSRF token: %d, want 403", res)
		}
		// A wrong token does not sign in.
		res, err := http.PostForm(r.base+"login", url.Values{"token": {"wrong-token-wrong-token"}})
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusUnauthorized {
			t.Errorf("sign-in with a wrong token: %d", res.StatusCode)
		}
		// A form from another origin, with a valid session and token.
		form.Set("csrf", csrfOf(t, c, r.base+"dlq"))
		req, _ := http.NewRequest(http.MethodPost, r.base+"dlq/confirm", strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", "https://evil.example")
		res, err = c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusForbidden {
			t.Errorf("a form from another origin: %d, want 403", res.StatusCode)
		}
	})

	t.Run("ForgedDeadLetterRefused", func(t *testing.T) {
		// A dead letter naming ok-1's stream sequence under another ID:
		// jetinbox dlq refuses it, so must the console.
		ctx := context.Background()
		okSeq := seqOf(t, r, "ok-1")
		m := &nats.Msg{Subject: jsinbox.DeadLetterSubject("intents.1"), Data: []byte(`{"account":1,"amount":1000000}`), Header: nats.Header{
			jsinbox.HeaderScope: {"ledger"}, jsinbox.HeaderStream: {jsinbox.DefaultStream}, jsinbox.HeaderStreamSeq: {fmt.Sprint(okSeq)},
			jsinbox.HeaderMessageID: {"forged-1"}, jsinbox.HeaderStatus: {"rejected"}, jsinbox.HeaderReason: {"forged"}, jsinbox.HeaderSubject: {"intents.1"}}}
		ack, err := r.e.JS.PublishMsg(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		c := login(t, r.base)
		form := url.Values{"seq": {fmt.Sprint(ack.Sequence)}, "confirm": {"yes"}, "csrf": {csrfOf(t, c, r.base+"dlq")}}
		body, code := postBody(t, c, r.base+"dlq/redrive", form)
		if code != http.StatusConflict || !strings.Contains(body, "refused, not re-driven") {
			t.Fatalf("forged dead letter: %d\n%s", code, body)
		}
	})

	needChromium(t)
	// A ceiling for a loaded CI machine, not a budget.
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	bctx, bcancel, err := console.Browser(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer bcancel()

	t.Run("Pages", func(t *testing.T) {
		for _, p := range []struct{ path, h1 string }{
			{"", "Overview"}, {"dlq", "Dead letters"}, {fmt.Sprintf("dlq/show?seq=%d", r.seq["to-999"]), "Dead letter"},
			{"verify?run=1", "Verify"}, {"partitions", "Partitions"}, {"intent", "Intent"}, {"login", "Sign in"},
		} {
			if got := text(t, bctx, r.base+p.path, "main h1"); got != p.h1 {
				t.Errorf("%s: h1 %q, want %q", p.path, got, p.h1)
			}
		}
		if got := text(t, bctx, r.base+"verify?run=1", "#verify-verdict"); !strings.HasPrefix(got, "clean") {
			t.Errorf("verify page: %q", got)
		}
		if got := text(t, bctx, r.base, "#charts"); !strings.Contains(got, "samples") {
			t.Errorf("overview charts: %q", got)
		}
	})

	t.Run("Lookups", func(t *testing.T) {
		for _, c := range []struct{ id, want string }{
			{"ok-1", "applied once"},
			{"to-999", "dead-lettered: rejected after"},
			{"dup-1", "applied once"},
			{"nobody", "not found"},
		} {
			got := text(t, bctx, r.base+"intent?id="+url.QueryEscape(c.id), "#verdict")
			if !strings.HasPrefix(got, c.want) {
				t.Errorf("intent %s: verdict %q, want it to start with %q", c.id, got, c.want)
			}
		}
		if got := text(t, bctx, r.base+"intent?id=dup-1", "#verdict"); !strings.Contains(got, "another copy in the stream was settled as a duplicate") {
			t.Errorf("dup-1: %q: want the second copy named", got)
		}
		if got := text(t, bctx, r.base+"intent?key="+httpKey, "#verdict"); !strings.HasPrefix(got, "applied once") {
			t.Errorf("Idempotency-Key %s: verdict %q, want applied once", httpKey, got)
		}
		if got := text(t, bctx, r.base+"intent?key="+httpKey, "#timeline"); !strings.Contains(got, `Idempotency-Key "order-8812" by "acme" answered 202`) ||
			!strings.Contains(got, "table idempotency_keys") || !strings.Contains(got, "published at") || !strings.Contains(got, "ledger entry: account 4, amount 3") {
			t.Errorf("Idempotency-Key %s: the timeline lacks the key, its outbox row or the effect:\n%s", httpKey, got)
		}
		// By the intake's intent ID, the key is found through its hash.
		tl := text(t, bctx, r.base+"intent?key="+httpKey, "#timeline")
		if id := regexp.MustCompile(`idem:[0-9a-f]{48}`).FindString(tl); id == "" {
			t.Errorf("no intent ID in the key's timeline:\n%s", tl)
		} else if got := text(t, bctx, r.base+"intent?id="+id, "#timeline"); !strings.Contains(got, `Idempotency-Key "order-8812"`) {
			t.Errorf("intent %s: the timeline lacks its key:\n%s", id, got)
		}
		if got := text(t, bctx, r.base+"intent?id=conf-1", "#verdict"); !strings.HasPrefix(got, "applied once") ||
			!strings.Contains(got, "conflict: the ID was published 1 time(s) with another payload") || strings.Contains(got, "duplicate") {
			t.Errorf("conf-1: %q: want applied once and the conflict, no duplicate", got)
		}
		if got := text(t, bctx, r.base+"intent?id=to-999", "#timeline"); !strings.Contains(got, "unknown account 999") || !strings.Contains(got, "INTENTS_DLQ seq") {
			t.Errorf("to-999 timeline lacks the reason or the dead letter's source:\n%s", got)
		}
	})

	t.Run("HostilePayloadDoesNotRun", func(t *testing.T) {
		for _, p := range []string{fmt.Sprintf("dlq/show?seq=%d", r.seq["xss"]), "intent?id=xss", "dlq"} {
			if err := chromedp.Do(bctx, chromedp.Navigate(r.base+p), chromedp.WaitReady(chromedp.CSS("main h1"))); err != nil {
				t.Fatal(err)
			}
			res, err := chromedp.Run(bctx, chromedp.Evaluate[string](`JSON.stringify([String(window.__pwned), document.title, document.querySelectorAll("main script, main img").length, document.querySelector("main").textContent.includes("<script>document.title")])`))
			if err != nil {
				t.Fatal(err)
			}
			want := `["undefined","` + titleOf(p) + ` · jetinbox console",0,true]`
			if p == "dlq" { // the list shows no payloads
				want = strings.Replace(want, "true]", "false]", 1)
			}
			if res != want {
				t.Errorf("%s: [__pwned, title, script and img elements in main, payload shown as text] = %s", p, res)
			}
		}
		got := text(t, bctx, r.base+fmt.Sprintf("dlq/show?seq=%d", r.seq["xss"]), "#payload")
		if !strings.Contains(got, `\xff\xfe\u202e`) {
			t.Errorf("invalid UTF-8 and a bidi override not shown as escapes: %q", got)
		}
	})

	t.Run("Redrive", func(t *testing.T) {
		// Fix the cause (open account 999), then re-drive through the
		// pages: sign in, select, confirm.
		if _, err := r.e.Pool.Exec(ctx, `INSERT INTO accounts (id, balance) VALUES (999, 0)`); err != nil {
			t.Fatal(err)
		}
		step := func(what string, acts ...chromedp.Action[chromedp.Void]) {
			t.Helper()
			sctx, cancel := context.WithTimeout(bctx, time.Minute)
			defer cancel()
			if err := chromedp.Do(sctx, acts...); err != nil {
				h, _ := chromedp.Run(bctx, chromedp.Text(chromedp.CSS("main")))
				t.Fatalf("%s: %v; the page says:\n%s", what, err, h)
			}
		}
		step("sign in", chromedp.Navigate(r.base+"login"),
			chromedp.SetValue(chromedp.CSS(`input[name="token"]`), operatorToken),
			chromedp.Click(chromedp.CSS(`main form button`)),
			chromedp.WaitReady(chromedp.CSS("#letters")))
		step("select", chromedp.Click(chromedp.CSS(fmt.Sprintf(`input[name="seq"][value="%d"]`, r.seq["to-999"]))),
			chromedp.Click(chromedp.CSS("#redrive-selected")),
			chromedp.WaitReady(chromedp.CSS("#confirm-redrive")))
		step("confirm", chromedp.Click(chromedp.CSS("#confirm-redrive")),
			chromedp.WaitReady(chromedp.CSS("#redrive-output")))
		out, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS("#redrive-output")))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, "re-driven 1,") {
			t.Fatalf("re-drive output:\n%s", out)
		}
		settle(t, r.e.JS)
		if got := text(t, bctx, r.base+"intent?id=to-999", "#verdict"); !strings.HasPrefix(got, "applied once") {
			t.Errorf("to-999 after the re-drive: %q", got)
		}
		var bal int64
		if err := r.e.Pool.QueryRow(ctx, `SELECT balance FROM accounts WHERE id = 999`).Scan(&bal); err != nil || bal != 42 {
			t.Errorf("account 999: balance %d (%v), want the re-driven 42", bal, err)
		}
	})
}

var titleRE = regexp.MustCompile(`^(dlq/show|intent|dlq)`)

func titleOf(p string) string {
	return map[string]string{"dlq/show": "Dead letter", "intent": "Intent", "dlq": "Dead letters"}[titleRE.FindString(p)]
}

func text(t *testing.T, bctx context.Context, u, sel string) string {
	t.Helper()
	if err := chromedp.Do(bctx, chromedp.Navigate(u), chromedp.WaitReady(chromedp.CSS(sel))); err != nil {
		t.Fatalf("%s: %v", u, err)
	}
	s, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		t.Fatalf("%s %s: %v", u, sel, err)
	}
	return strings.TrimSpace(s)
}

func login(t *testing.T, base string) *http.Client {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := c.PostForm(base+"login", url.Values{"token": {operatorToken}})
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusSeeOther {
		t.Fatalf("sign-in: %d", res.StatusCode)
	}
	return c
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

func csrfOf(t *testing.T, c *http.Client, u string) string {
	t.Helper()
	res, err := c.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	m := csrfRE.FindSubmatch(b)
	if m == nil {
		t.Fatalf("%s: no CSRF token in the page", u)
	}
	return string(m[1])
}

func post(t *testing.T, c *http.Client, u string, form url.Values) int {
	t.Helper()
	_, code := postBody(t, c, u, form)
	return code
}

func postBody(t *testing.T, c *http.Client, u string, form url.Values) (string, int) {
	t.Helper()
	res, err := c.PostForm(u, form)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	return string(b), res.StatusCode
}

var seqMu sync.Mutex

// seqOf finds the stream sequence of an applied ID in its inbox row.
func seqOf(t *testing.T, r *rig, id string) uint64 {
	t.Helper()
	seqMu.Lock()
	defer seqMu.Unlock()
	var seq int64
	if err := r.e.Pool.QueryRow(context.Background(), `SELECT stream_seq FROM inbox WHERE message_id = $1`, id).Scan(&seq); err != nil {
		t.Fatal(err)
	}
	return uint64(seq)
}
