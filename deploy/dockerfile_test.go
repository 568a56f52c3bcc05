package deploy_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var dockerfileCopy = regexp.MustCompile(`(?m)^COPY --from=build ((?:/out/[a-z]+ )+)(/\S+/)$`)

// dockerfileBinaries returns the paths of the binaries deploy/Dockerfile puts
// into its final image.
func dockerfileBinaries(fsys files) map[string]bool {
	m := dockerfileCopy.FindSubmatch(fsys["Dockerfile"])
	out := map[string]bool{}
	if m == nil {
		return out
	}
	for _, f := range strings.Fields(string(m[1])) {
		out[string(m[2])+filepath.Base(f)] = true
	}
	return out
}

func validateDockerfile(fsys files) error {
	b, err := fsys.get("Dockerfile")
	if err != nil {
		return err
	}
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("Dockerfile: "+format, args...))
		}
	}
	s := string(b)
	froms := regexp.MustCompile(`(?m)^FROM (\S+)`).FindAllStringSubmatch(s, -1)
	check(len(froms) == 2, "want two stages, found %d", len(froms))
	if len(froms) == 2 {
		check(strings.HasPrefix(froms[0][1], "golang:1.26"), "build stage %q, want golang:1.26", froms[0][1])
		check(strings.HasPrefix(froms[1][1], "gcr.io/distroless/"), "runtime stage %q, want distroless", froms[1][1])
	}
	build := regexp.MustCompile(`go build [^\n]*`).FindString(s)
	for _, c := range []string{"./cmd/consumer", "./cmd/producer", "./cmd/jetinbox"} {
		check(strings.Contains(build, c), "go build does not build %s", c)
	}
	bins := dockerfileBinaries(fsys)
	for _, b := range []string{"consumer", "producer", "jetinbox"} {
		check(bins["/usr/local/bin/"+b], "final image lacks /usr/local/bin/%s", b)
	}
	check(regexp.MustCompile(`(?m)^USER (65532|nonroot)`).MatchString(s), "final image must run as a non-root USER")
	return errors.Join(errs...)
}

func TestDockerfile(t *testing.T) {
	if err := validateDockerfile(loadFiles(t)); err != nil {
		t.Fatal(err)
	}
}
