package version

import "testing"

func TestAsked(t *testing.T) {
	for args, want := range map[string]bool{"-version": true, "--version": true, "version": false, "-v": false} {
		if got := Asked([]string{args}); got != want {
			t.Errorf("Asked(%q) = %v", args, got)
		}
	}
	if Asked([]string{"-version", "x"}) || Asked(nil) {
		t.Error("Asked with other arguments")
	}
}

func TestLinkTimeVersionWins(t *testing.T) {
	old := Version
	defer func() { Version = old }()
	Version = "v1.2.3"
	if String() != "v1.2.3" {
		t.Fatalf("String() = %q", String())
	}
	Version = ""
	if String() == "" {
		t.Fatal("no version without one set at link time")
	}
}
