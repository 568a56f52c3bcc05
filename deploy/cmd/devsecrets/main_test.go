package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRefusesToOverwrite(t *testing.T) {
	out := filepath.Join(t.TempDir(), "secrets")
	auth := filepath.Join("..", "..", "nats", "auth.conf")
	if err := run([]string{"-out", out, "-auth", auth}, io.Discard); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(out, "nats-auth.conf")); err != nil {
		t.Fatal(err)
	}
	err := run([]string{"-out", out, "-auth", auth}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "-force") {
		t.Fatalf("second run without -force: %v", err)
	}
	if err := run([]string{"-out", out, "-auth", auth, "-force"}, io.Discard); err != nil {
		t.Fatal(err)
	}
}
