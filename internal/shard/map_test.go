package shard

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/jetinbox/jetinbox/inbox"
)

func TestMapFile(t *testing.T) {
	dir := t.TempDir()
	write := func(s string) string {
		p := filepath.Join(dir, "m.json")
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	m, err := Load(write(`{"partitions": 8, "shards": [{"name": "a", "database_url": "postgres://a", "partitions": "0-3"}, {"name": "b", "database_url_env": "B_URL", "partitions": "4-7"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if m.Stream != "PINTENTS" || m.Subject != "pintents" || m.Scope != "ledger" || m.Durable(3) != "ledger_p03" || m.Filter(3) != "pintents.3.>" {
		t.Errorf("defaults: %+v, durable %s, filter %s", m, m.Durable(3), m.Filter(3))
	}
	if src, dest := m.SubjectTransform(); src != "pintents.*.>" || dest != "pintents.{{partition(8,1)}}.{{wildcard(1)}}.>" {
		t.Errorf("transform %s → %s", src, dest)
	}
	b, _ := m.Shard("b")
	if u, err := b.URL(func(k string) string { return map[string]string{"B_URL": "postgres://b"}[k] }); err != nil || u != "postgres://b" {
		t.Errorf("URL from the environment: %q %v", u, err)
	}
	if _, err := b.URL(func(string) string { return "" }); err == nil {
		t.Error("an unset URL variable passed")
	}
	// A move rewrites the file atomically; the old map is untouched.
	nm, err := m.Move(2, "b")
	if err != nil {
		t.Fatal(err)
	}
	if m.Owner(2) != "a" || nm.Owner(2) != "b" {
		t.Errorf("owners after the move: old %s, new %s", m.Owner(2), nm.Owner(2))
	}
	p := filepath.Join(dir, "moved.json")
	if err := nm.Save(p); err != nil {
		t.Fatal(err)
	}
	back, err := Load(p)
	if err != nil || back.Shards[0].Partitions.String() != "0-1,3" || back.Shards[1].Partitions.String() != "2,4-7" {
		t.Fatalf("saved map: %+v %v", back, err)
	}
	for bad, want := range map[string]string{
		`{"partitions": 8, "shards": [{"name": "a", "database_url": "x", "partitions": "0-7"}, {"name": "b", "database_url": "y", "partitions": "7"}]}`: "owned by shards",
		`{"partitions": 8, "shards": [{"name": "a", "database_url": "x", "partitions": "0-6"}]}`:                                                        "owned by no shard",
		`{"partitions": 8, "shards": [{"name": "a", "partitions": "0-7"}]}`:                                                                             "exactly one of database_url",
		`{"partitions": 8, "shards": [{"name": "a", "database_url": "x", "partitions": "0-8"}]}`:                                                        "out of range",
		`{"partitions": 8, "subject": "a.*", "shards": [{"name": "a", "database_url": "x", "partitions": "0-7"}]}`:                                      "subject",
		`{"partitions": 8, "shards": [{"name": "a", "database_url": "x", "partitions": "0-7"}], "extra": 1}`:                                            "unknown field",
		`{"partitions": 8, "shards": [{"name": "a", "database_url": "x", "partitions": [0]}]}`:                                                          "want a string",
		`{"partitions": 8, "shards": []}`: "no shards",
	} {
		if _, err := Load(write(bad)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err %v, want it to say %q", bad, err, want)
		}
	}
	if _, err := Load(filepath.Join(dir, "missing.json")); err == nil {
		t.Error("a missing file loaded")
	}
}

// fakeProc records what reaches the inbox processor.
type fakeProc struct{ got []string }

func (f *fakeProc) Process(_ context.Context, msgs []inbox.Message) ([]inbox.Outcome, error) {
	out := make([]inbox.Outcome, len(msgs))
	for i, m := range msgs {
		f.got = append(f.got, m.ID)
		out[i] = inbox.Outcome{Status: inbox.StatusApplied}
	}
	return out, nil
}
func (f *fakeProc) Scope() string                        { return "ledger" }
func (f *fakeProc) Stats() inbox.ProcessorStats          { return inbox.ProcessorStats{} }
func (f *fakeProc) Warm(context.Context, int) error      { return nil }
func (f *fakeProc) Ping(context.Context) error           { return nil }
func (f *fakeProc) Logger() *slog.Logger                 { return slog.Default() }
func (f *fakeProc) TracerProvider() trace.TracerProvider { return noop.NewTracerProvider() }

// TestProcessorChecksBeforeTheInbox: a message bound to another ID's
// partition is rejected and one of a partition not owned retried, and
// neither reaches the inbox; the rest keep their places.
func TestProcessorChecksBeforeTheInbox(t *testing.T) {
	m := (&Map{Partitions: 8}).WithDefaults()
	var owned, other string
	for i := 0; owned == "" || other == ""; i++ {
		id := "id-" + strings.Repeat("x", i)
		if PartitionOf(id, 8) == 1 {
			owned = id
		} else if other == "" {
			other = id
		}
	}
	f := &fakeProc{}
	p := NewProcessor(f, &m)
	p.SetOwned(Set{1})
	msgs := []inbox.Message{
		{ID: owned, Subject: StoredSubject(m.Subject, owned, "k", 8)},
		{ID: owned + "-misbound", Subject: StoredSubject(m.Subject, owned, "k", 8)},
		{ID: other, Subject: StoredSubject(m.Subject, other, "k", 8)},
		{ID: owned, Subject: "elsewhere.k"},
	}
	out, err := p.Process(context.Background(), msgs)
	if err != nil {
		t.Fatal(err)
	}
	if len(f.got) != 1 || f.got[0] != owned {
		t.Errorf("reached the inbox: %v, want only %s", f.got, owned)
	}
	want := []inbox.Status{inbox.StatusApplied, inbox.StatusRejected, inbox.StatusRetry, inbox.StatusRejected}
	for i, o := range out {
		if o.Status != want[i] {
			t.Errorf("message %d: %v (%s), want %v", i, o.Status, o.Reason, want[i])
		}
	}
	if !errors.Is(out[1].Err, ErrBinding) || !inbox.IsPermanent(out[1].Err) || !errors.Is(out[2].Err, ErrNotOwned) {
		t.Errorf("errors: %v, %v", out[1].Err, out[2].Err)
	}
}
