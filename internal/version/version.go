// Package version says which build of jetinbox is running: for --version
// and the jetinbox_build_info metric.
package version

import (
	"runtime/debug"
	"strings"
)

// Version is set at link time by release builds (the Dockerfile passes
// -ldflags "-X github.com/jetinbox/jetinbox/internal/version.Version=v1.2.3").
// Empty otherwise: String then reads the module version or the VCS stamp.
var Version = ""

// String returns the version: the one set at link time, else the module's
// (go install …@v1.2.3), else the VCS revision the binary was built from
// ("rev 1a2b3c4d5e6f", "+dirty" for uncommitted changes), else "(devel)".
func String() string {
	if Version != "" {
		return Version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "(devel)"
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev string
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return "(devel)"
	}
	rev = "rev " + rev[:min(12, len(rev))]
	if dirty {
		rev += "+dirty"
	}
	return rev
}

// Go returns the Go version the binary was built with.
func Go() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		return bi.GoVersion
	}
	return "unknown"
}

// Asked reports whether args ask for the version: a lone -version or
// --version.
func Asked(args []string) bool {
	return len(args) == 1 && strings.TrimLeft(args[0], "-") == "version" && strings.HasPrefix(args[0], "-")
}
