package deploy_test

// Every deployment file is read by the parser of the tool that runs it (the
// embedded nats-server's config parser, nats.go's stream and consumer types,
// compose-go, the Kubernetes API types in strict mode, Prometheus's config
// loader and rule parser, PromQL for the dashboard) and then checked for the
// settings jetinbox's guarantees rest on (README.md, "Why each setting
// exists"). Cross-file facts (the stream name in the consumer's env, the
// alert threshold that is 90% of max_ack_pending, the TLS file names the
// generator writes) are checked where they meet. TestMutationsAreRejected
// breaks files on purpose and requires every validator to notice.
//
// The checks live in one file per tool (nats_config_test.go,
// jetstream_defs_test.go, compose_test.go, ...); this file holds what they
// share: the deploy tree as a mutable set of files and the secrets that
// cmd/devsecrets generates once per test binary.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/jetinbox/jetinbox/deploy/internal/devsecrets"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

// files is the deploy directory's content by slash path, so that tests can
// validate a mutated copy without touching the real files.
type files map[string][]byte

func loadFiles(t testing.TB) files {
	t.Helper()
	fsys := files{}
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p == "secrets" || strings.HasPrefix(d.Name(), ".") && p != "." {
				return filepath.SkipDir
			}
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		fsys[filepath.ToSlash(p)] = b
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return fsys
}

func (f files) get(name string) ([]byte, error) {
	b, ok := f[name]
	if !ok {
		return nil, fmt.Errorf("%s: missing", name)
	}
	return b, nil
}

// with returns a copy of f where the first occurrence of old in name is new;
// it fails the test if old is not there, so a mutation cannot go stale.
func (f files) with(t testing.TB, name, old, new string) files {
	t.Helper()
	b, ok := f[name]
	if !ok {
		t.Fatalf("mutation: no file %s", name)
	}
	if !bytes.Contains(b, []byte(old)) {
		t.Fatalf("mutation: %s does not contain %q", name, old)
	}
	c := maps.Clone(f)
	c[name] = bytes.Replace(b, []byte(old), []byte(new), 1)
	return c
}

// secretsFixture is what `go run ./cmd/devsecrets` writes, generated once
// per test binary (TestMain) into a temporary directory.
type secretsFixture struct {
	dir   string
	files []string
	keys  map[string]string
}

var devSecrets *secretsFixture

func TestMain(m *testing.M) {
	os.Exit(func() int {
		dir, err := os.MkdirTemp("", "jetinbox-devsecrets-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		tmpl, err := os.ReadFile("nats/auth.conf")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		res, err := devsecrets.Generate(devsecrets.Options{Dir: dir, AuthTemplate: tmpl})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		devSecrets = &secretsFixture{dir: dir, files: res.Files, keys: res.PublicKeys}
		// The alert pipeline test takes a database from testenv's shared
		// server, which would outlive this binary otherwise.
		defer testenv.CloseShared()
		return m.Run()
	}())
}

func fixture(testing.TB) *secretsFixture { return devSecrets }

func decodeStrict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("trailing data after the JSON object")
	}
	return nil
}

// applyOrder reports whether text names the advisory stream's and the rescue
// consumer's files (after prefix) before the intents stream's: a consumer
// of the intents stream can then never see a max-deliveries advisory sent
// with nowhere to keep it.
func applyOrder(text, prefix string) bool {
	adv := strings.Index(text, prefix+"advisories-stream.json")
	rescue := strings.Index(text, prefix+"ledger-rescue-consumer.json")
	intents := strings.Index(text, prefix+"intents-stream.json")
	return adv >= 0 && rescue > adv && intents > rescue
}

// imageAtLeast reports whether image is repo:X.Y.Z[-suffix][@digest] with
// X.Y.Z >= min.
func imageAtLeast(image, repo string, min [3]int) bool {
	image, _, _ = strings.Cut(image, "@")
	r, tag, ok := strings.Cut(image, ":")
	if !ok || r != repo {
		return false
	}
	tag, _, _ = strings.Cut(tag, "-")
	parts := strings.Split(tag, ".")
	if len(parts) != 3 {
		return false
	}
	var v [3]int
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil {
			return false
		}
		v[i] = n
	}
	for i := range v {
		if v[i] != min[i] {
			return v[i] > min[i]
		}
	}
	return true
}
