package deploy_test

import (
	"bytes"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var pgSetting = regexp.MustCompile(`^\s*([a-z_]+)\s*=\s*('(?:[^']|'')*'|[^\s#]+)`)

// pgSettings parses postgresql.conf syntax: name = value, # comments.
func pgSettings(b []byte) (map[string]string, error) {
	out := map[string]string{}
	for i, line := range strings.Split(string(b), "\n") {
		t := strings.TrimSpace(line)
		if t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		m := pgSetting.FindStringSubmatch(line)
		if m == nil {
			return nil, fmt.Errorf("line %d: not name = value: %q", i+1, line)
		}
		if _, dup := out[m[1]]; dup {
			return nil, fmt.Errorf("line %d: %s set twice", i+1, m[1])
		}
		out[m[1]] = strings.Trim(m[2], "'")
	}
	return out, nil
}

// pgKnownSettings lists the parameter names the installed PostgreSQL server
// knows (postgres --describe-config needs no cluster and runs as root).
var pgKnownSettings = func() func(t testing.TB) map[string]bool {
	var known map[string]bool
	return func(t testing.TB) map[string]bool {
		t.Helper()
		if known != nil {
			return known
		}
		bin, err := findPostgresBin()
		if err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(filepath.Join(bin, "postgres"), "--describe-config").Output()
		if err != nil {
			t.Fatalf("postgres --describe-config: %v", err)
		}
		known = map[string]bool{}
		for _, line := range strings.Split(string(out), "\n") {
			if name, _, ok := strings.Cut(line, "\t"); ok {
				known[name] = true
			}
		}
		return known
	}
}()

func validatePostgresConf(fsys files, known map[string]bool) error {
	b, err := fsys.get("postgres/postgresql.conf.snippet")
	if err != nil {
		return err
	}
	s, err := pgSettings(b)
	if err != nil {
		return fmt.Errorf("postgres/postgresql.conf.snippet: %w", err)
	}
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("postgres/postgresql.conf.snippet: "+format, args...))
		}
	}
	for name := range s {
		check(known[name], "%s is not a PostgreSQL setting", name)
	}
	for _, name := range []string{"fsync", "synchronous_commit", "full_page_writes", "ssl"} {
		check(s[name] == "on", "%s = %q, want on", name, s[name])
	}
	for _, name := range []string{"lock_timeout", "statement_timeout", "idle_in_transaction_session_timeout"} {
		check(s[name] != "" && s[name] != "0", "%s must be set to a non-zero timeout", name)
	}
	// Documented (commented: a standby name that does not exist would block
	// every commit), with its reason.
	check(regexp.MustCompile(`(?m)^#\s*synchronous_standby_names\s*=`).Match(b), "synchronous_standby_names example missing")
	check(bytes.Contains(b, []byte("async")) && bytes.Contains(b, []byte("acked")), "the reason for a synchronous standby is missing")
	check(bytes.Contains(b, []byte("verify-full")), "the sslmode=verify-full note for clients is missing")
	return errors.Join(errs...)
}

func TestPostgresConf(t *testing.T) {
	if err := validatePostgresConf(loadFiles(t), pgKnownSettings(t)); err != nil {
		t.Fatal(err)
	}
}
