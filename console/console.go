// Package console is jetinbox's operator console: an [http.Handler] that
// answers "what happened to this intent?", shows the pipeline's health, and
// re-drives dead letters, server-rendered with html/template from embedded
// assets (nothing is fetched from the internet).
//
// # Mounting
//
// The handler serves every page under [Config.Prefix], so it mounts beside
// an application's own routes:
//
//	h, err := console.New(console.Config{Prefix: "/console", JS: js, ReadPG: pool})
//	mux.Handle("/console/", h)
//
// `jetinbox console` serves it on 127.0.0.1:8089 by default.
//
// # What it reads
//
// It reads what the commands read, through the same packages: verify runs
// internal/verify, the dead-letter pages read and re-drive through the
// package `jetinbox dlq` uses (and refuse what it refuses, e.g. a dead
// letter whose stream sequence holds another intent), the partitions page
// reads the shards' partition tables. Reads need only the verifier's
// database role and NATS user; a re-drive needs [Config.Redrive], which
// runs under a role of its own.
//
// # Security
//
// Read-only unless an operator credential is configured: [Config.OperatorToken]
// (an operator signs in with it and gets a session cookie) or
// [Config.Authorize] (an embedder's check: a client certificate, a header
// set by a trusted proxy). Every action is a POST that needs an operator
// session and its CSRF token. Every answer carries a strict
// Content-Security-Policy (no inline script; the one script is a
// same-origin file) and refuses framing. Payloads, subjects, headers and
// reasons are hostile input: escaped by html/template, cut to a bound, and
// invalid UTF-8, control and bidirectional characters shown as escapes.
package console

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"database/sql"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/dlq"
	"github.com/jetinbox/jetinbox/internal/shard"
)

//go:embed assets
var assets embed.FS

// CSP is the Content-Security-Policy of every answer: no inline script or
// style, nothing from another origin, no framing, forms only to the
// console itself.
const CSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// Config says what the console reads and who may act.
type Config struct {
	// Prefix is the path the handler is mounted under, without a trailing
	// slash ("" or "/console"). Default "".
	Prefix string
	// JS reads the streams (the verifier's NATS user: direct gets, stream
	// and consumer info, the dead-letter stream). Required.
	JS jetstream.JetStream
	// ReadPG or ReadSQLite is the inbox's database, read under the
	// verifier's role. One of them is required.
	ReadPG     *pgxpool.Pool
	ReadSQLite *sql.DB
	// Stream, Scope and Durable name what is shown. Defaults "INTENTS",
	// "ledger", "ledger".
	Stream, Scope, Durable string
	// Redrive, if set, lets an operator re-drive dead letters. Nil: the
	// console cannot act, whatever the credential.
	Redrive *Redrive
	// Shards, set for a sharded stream, shows the partitions page and
	// reads each shard's partition table (ShardPools, by shard name).
	Shards     *shard.Map
	ShardPools map[string]*pgxpool.Pool
	// OperatorToken, if set, is the credential an operator signs in with.
	// Empty and no Authorize: read-only.
	OperatorToken string
	// Authorize, if set, says whether a request comes from an operator
	// (a verified client certificate, a header a trusted proxy sets and
	// strips from clients). Such a request gets an operator session
	// without signing in; actions still need its CSRF token.
	Authorize func(*http.Request) bool
	// VerifyCheckpoint is the file `jetinbox verify -watch -checkpoint`
	// keeps, shown on the verify page. Empty: not shown.
	VerifyCheckpoint string
	// Retention is the inbox retention in use, for the horizon check.
	// Zero: never pruned.
	Retention time.Duration
	// Hops are the timeline's sources. Default [DefaultHops]; append to it
	// to add a hop.
	Hops []HopSource
	// ScanWindow bounds the stream scan that finds an intent's copies:
	// the last ScanWindow messages are read. Default 20000.
	ScanWindow uint64
	// Logger, default slog.Default().
	Logger *slog.Logger
}

// Redrive is what a re-drive needs: a NATS user that may publish to the
// intents stream, and the inbox under a role that may delete rejected rows
// (the console's own re-drive role). Route, set for a sharded stream,
// picks each dead letter's shard (see `jetinbox dlq -shards`).
type Redrive struct {
	JS     jetstream.JetStream
	Store  *cli.Store
	Route  dlq.Route
	Stream string
}

// Console is the handler. Make it with [New].
type Console struct {
	cfg    Config
	db     db
	tmpl   map[string]*template.Template
	static http.Handler
	secret [32]byte
	token  [32]byte
	log    *slog.Logger

	verifying sync.Mutex // held by the one verify run at a time

	mu       sync.Mutex
	sessions map[string]time.Time
	signIns  *signInLimiter
	samples  samples
}

// New checks the config and makes the console.
func New(cfg Config) (*Console, error) {
	if cfg.JS == nil {
		return nil, errors.New("console: a JetStream client is required")
	}
	if (cfg.ReadPG == nil) == (cfg.ReadSQLite == nil) {
		return nil, errors.New("console: exactly one of ReadPG and ReadSQLite is required")
	}
	cfg.Prefix = strings.TrimSuffix(cfg.Prefix, "/")
	if cfg.Prefix != "" && !strings.HasPrefix(cfg.Prefix, "/") {
		return nil, fmt.Errorf("console: prefix %q must start with /", cfg.Prefix)
	}
	if cfg.Stream == "" {
		cfg.Stream = jsinbox.DefaultStream
	}
	if cfg.Scope == "" {
		cfg.Scope = "ledger"
	}
	if cfg.Durable == "" {
		cfg.Durable = "ledger"
	}
	if cfg.Hops == nil {
		cfg.Hops = DefaultHops()
	}
	if cfg.ScanWindow == 0 {
		cfg.ScanWindow = 20000
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	c := &Console{cfg: cfg, log: cfg.Logger, sessions: map[string]time.Time{}, signIns: newSignInLimiter()}
	if cfg.ReadPG != nil {
		c.db = db{pg: cfg.ReadPG}
	} else {
		c.db = db{lite: cfg.ReadSQLite}
	}
	if _, err := rand.Read(c.secret[:]); err != nil {
		return nil, err
	}
	c.token = sha256.Sum256([]byte(cfg.OperatorToken))
	var err error
	if c.tmpl, err = parseTemplates(cfg.Prefix); err != nil {
		return nil, err
	}
	sub, err := fs.Sub(assets, "assets/static")
	if err != nil {
		return nil, err
	}
	c.static = http.StripPrefix(cfg.Prefix+"/static/", http.FileServerFS(sub))
	return c, nil
}

// maxForm bounds a POSTed form.
const maxForm = 64 << 10

// ServeHTTP serves the console's pages under the prefix.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", CSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	path, ok := strings.CutPrefix(r.URL.Path, c.cfg.Prefix)
	if !ok {
		http.NotFound(w, r)
		return
	}
	if strings.HasPrefix(path, "/static/") {
		c.static.ServeHTTP(w, r)
		return
	}
	if r.Method == http.MethodPost {
		r.Body = http.MaxBytesReader(w, r.Body, maxForm)
		if !c.sameOrigin(r) {
			c.fail(w, r, http.StatusForbidden, "refused: a form from another origin")
			return
		}
	} else if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD, POST")
		c.fail(w, r, http.StatusMethodNotAllowed, "method not allowed")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Minute)
	defer cancel()
	r = r.WithContext(ctx)
	switch {
	case path == "" || path == "/":
		c.overview(w, r)
	case path == "/charts":
		c.charts(w, r)
	case path == "/intent":
		c.intent(w, r)
	case path == "/dlq":
		c.deadLetters(w, r)
	case path == "/dlq/show":
		c.deadLetter(w, r)
	case path == "/dlq/confirm" && r.Method == http.MethodPost:
		c.confirmRedrive(w, r)
	case path == "/dlq/redrive" && r.Method == http.MethodPost:
		c.redrive(w, r)
	case path == "/verify":
		c.verify(w, r)
	case path == "/partitions":
		c.partitions(w, r)
	case path == "/login" && r.Method == http.MethodPost:
		c.login(w, r)
	case path == "/login":
		c.render(w, r, "login", nil)
	case path == "/logout" && r.Method == http.MethodPost:
		c.logout(w, r)
	default:
		c.fail(w, r, http.StatusNotFound, "no such page")
	}
}

// sameOrigin refuses a POST whose Origin (or Sec-Fetch-Site) names
// another site: a second wall behind the CSRF token.
func (c *Console) sameOrigin(r *http.Request) bool {
	site := r.Header.Get("Sec-Fetch-Site")
	if site != "" && site != "same-origin" && site != "none" {
		return false
	}
	o := r.Header.Get("Origin")
	if o == "" || o == "null" {
		// No Origin: not a browser's cross-site form (curl, a test);
		// "null": a browser that hides it, trusted only with its own
		// word that the form is same-origin.
		return o == "" || site == "same-origin"
	}
	u, err := url.Parse(o)
	return err == nil && u.Host == r.Host
}

const (
	sessionCookie = "jetinbox_console"
	sessionTTL    = 12 * time.Hour
)

// session returns the request's operator session ID, or "" when it has
// none. A request the Authorize hook accepts gets one on the spot.
func (c *Console) session(w http.ResponseWriter, r *http.Request) string {
	if ck, err := r.Cookie(sessionCookie); err == nil {
		c.mu.Lock()
		exp, ok := c.sessions[ck.Value]
		c.mu.Unlock()
		if ok && time.Now().Before(exp) {
			return ck.Value
		}
	}
	if c.cfg.Authorize != nil && c.cfg.Redrive != nil && c.cfg.Authorize(r) {
		return c.newSession(w, r)
	}
	return ""
}

func (c *Console) newSession(w http.ResponseWriter, r *http.Request) string {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return ""
	}
	id := hex.EncodeToString(b[:])
	now := time.Now()
	c.mu.Lock()
	for k, exp := range c.sessions {
		if now.After(exp) {
			delete(c.sessions, k)
		}
	}
	c.sessions[id] = now.Add(sessionTTL)
	c.mu.Unlock()
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: id, Path: c.cfg.Prefix + "/", HttpOnly: true,
		Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode, MaxAge: int(sessionTTL.Seconds())})
	return id
}

// csrf is the token an operator session's forms carry.
func (c *Console) csrf(session string) string {
	if session == "" {
		return ""
	}
	m := hmac.New(sha256.New, c.secret[:])
	m.Write([]byte("csrf\x00" + session))
	return hex.EncodeToString(m.Sum(nil))
}

// canAct says whether actions are possible at all: a re-drive is
// configured and some credential is.
func (c *Console) canAct() bool {
	return c.cfg.Redrive != nil && (c.cfg.OperatorToken != "" || c.cfg.Authorize != nil)
}

// operator checks an action: an operator session and its CSRF token. It
// answers the refusal itself and returns false.
func (c *Console) operator(w http.ResponseWriter, r *http.Request) bool {
	if !c.canAct() {
		c.fail(w, r, http.StatusForbidden, "refused: this console is read-only (no operator credential or no re-drive role configured)")
		return false
	}
	s := c.session(w, r)
	if s == "" {
		c.fail(w, r, http.StatusUnauthorized, "refused: sign in as an operator first")
		return false
	}
	if err := r.ParseForm(); err != nil {
		c.fail(w, r, http.StatusBadRequest, "bad form: "+err.Error())
		return false
	}
	got := r.PostForm.Get("csrf")
	if got == "" || !hmac.Equal([]byte(got), []byte(c.csrf(s))) {
		c.fail(w, r, http.StatusForbidden, "refused: missing or wrong CSRF token (reload the page and try again)")
		return false
	}
	return true
}

func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	if c.cfg.OperatorToken == "" || c.cfg.Redrive == nil {
		c.fail(w, r, http.StatusForbidden, "refused: this console has no operator credential configured")
		return
	}
	// Checked before the form is read: a blocked host's guess is not
	// even compared.
	lim := c.signIns.limiter(r)
	if b, wait := blocked(lim); b {
		c.tooMany(w, r, wait)
		return
	}
	if err := r.ParseForm(); err != nil {
		c.fail(w, r, http.StatusBadRequest, "bad form")
		return
	}
	got := sha256.Sum256([]byte(r.PostForm.Get("token")))
	if subtle.ConstantTimeCompare(got[:], c.token[:]) != 1 {
		lim.Allow() // one of the host's wrong sign-ins used
		c.log.Warn("console: a sign-in with a wrong token", "remote", r.RemoteAddr)
		c.fail(w, r, http.StatusUnauthorized, "refused: wrong token")
		return
	}
	c.newSession(w, r)
	http.Redirect(w, r, c.cfg.Prefix+"/dlq", http.StatusSeeOther)
}

func (c *Console) logout(w http.ResponseWriter, r *http.Request) {
	if !c.operator(w, r) {
		return
	}
	if ck, err := r.Cookie(sessionCookie); err == nil {
		c.mu.Lock()
		delete(c.sessions, ck.Value)
		c.mu.Unlock()
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: c.cfg.Prefix + "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, c.cfg.Prefix+"/", http.StatusSeeOther)
}

// page is what every template gets.
type page struct {
	Prefix   string
	Title    string
	Stream   string
	Scope    string
	Sharded  bool
	Operator bool
	CanAct   bool
	CSRF     string
	Data     any
}

func (c *Console) render(w http.ResponseWriter, r *http.Request, name string, data any) {
	c.renderStatus(w, r, http.StatusOK, name, data)
}

func (c *Console) renderStatus(w http.ResponseWriter, r *http.Request, status int, name string, data any) {
	s := c.session(w, r)
	p := page{Prefix: c.cfg.Prefix, Title: titles[name], Stream: c.cfg.Stream, Scope: c.cfg.Scope, Sharded: c.cfg.Shards != nil,
		Operator: s != "", CanAct: c.canAct(), CSRF: c.csrf(s), Data: data}
	var buf bytes.Buffer
	if err := c.tmpl[name].ExecuteTemplate(&buf, "layout", p); err != nil {
		c.log.Error("console: render", "page", name, "err", err)
		http.Error(w, "console: render failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

func (c *Console) fail(w http.ResponseWriter, r *http.Request, status int, msg string) {
	c.renderStatus(w, r, status, "error", msg)
}

var titles = map[string]string{
	"overview": "Overview", "intent": "Intent", "dlq": "Dead letters", "dlqshow": "Dead letter", "confirm": "Confirm re-drive",
	"redriven": "Re-drive", "verify": "Verify", "partitions": "Partitions", "login": "Sign in", "error": "Error",
}

func parseTemplates(prefix string) (map[string]*template.Template, error) {
	funcs := template.FuncMap{
		"safe":  func(s string) string { return Safe([]byte(s), 4096) },
		"ago":   ago,
		"pct":   func(a, b float64) string { return pct(a, b) },
		"fmtT":  func(t time.Time) string { return fmtTime(t) },
		"short": func(s string) string { return Safe([]byte(s), 160) },
	}
	out := map[string]*template.Template{}
	for name := range titles {
		t, err := template.New(name).Funcs(funcs).ParseFS(assets, "assets/templates/layout.html", "assets/templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", name, err)
		}
		out[name] = t
	}
	_ = prefix
	return out, nil
}
