package deploy_test

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// pinnedImage is name:tag@sha256:<64 hex>: the tag for people, the digest
// for the runtime, which pulls exactly that image whatever the tag later
// points at.
var pinnedImage = regexp.MustCompile(`^[a-z0-9][a-z0-9./_-]*:[A-Za-z0-9._-]+@sha256:[0-9a-f]{64}$`)

// builtHere are images this repository builds itself (deploy/Dockerfile):
// there is no registry digest to pin until the operator pushes one
// (kustomize edit set image jetinbox=REGISTRY/jetinbox@sha256:…).
var builtHere = []string{"${JETINBOX_IMAGE:-jetinbox:dev}", "jetinbox"}

// digestUnknown are images whose digest could not be looked up when they
// were last changed: pin them (crane digest IMAGE) before a production
// deployment. The list may only shrink; it is empty.
var digestUnknown = []string{}

// imageRefs returns every image a deploy file names: compose services,
// Dockerfile stages, Kubernetes containers, the NATS chart's server image.
func imageRefs(t *testing.T, fsys files) map[string][]string {
	t.Helper()
	refs := map[string][]string{}
	add := func(file, ref string) { refs[file] = append(refs[file], strings.Trim(ref, `"'`)) }
	yamlImage := regexp.MustCompile(`(?m)^\s*(?:-\s+)?image:\s*(\S+)\s*$`)
	for name, b := range fsys {
		switch {
		case name == "Dockerfile":
			for _, m := range regexp.MustCompile(`(?m)^FROM\s+(?:--platform=\S+\s+)?(\S+)`).FindAllStringSubmatch(string(b), -1) {
				add(name, m[1])
			}
		case name == "kubernetes/nats-values.yaml":
			var v natsValues
			if err := decodeK8s(fsys, name, &v); err != nil {
				t.Fatal(err)
			}
			add(name, "nats:"+v.Container.Image.Tag)
		case name == "compose.yaml" || strings.HasPrefix(name, "kubernetes/") && strings.HasSuffix(name, ".yaml"):
			for _, m := range yamlImage.FindAllStringSubmatch(string(b), -1) {
				add(name, m[1])
			}
		}
	}
	return refs
}

// TestImagesPinnedByDigest: every image the deploy files pull is
// name:tag@sha256:…, except the ones built here and the few whose digest is
// still to be looked up (digestUnknown), which must really be unpinned and
// named as they are.
func TestImagesPinnedByDigest(t *testing.T) {
	fsys := loadFiles(t)
	if errs := checkImagesPinned(imageRefs(t, fsys)); len(errs) > 0 {
		t.Error(strings.Join(errs, "\n"))
	}
	// The check catches a tag without digest, a digest without tag, and a
	// malformed digest.
	for _, bad := range []string{"postgres:15", "postgres@sha256:" + strings.Repeat("a", 64), "postgres:15@sha256:abc", "golang:1.26@sha512:" + strings.Repeat("a", 128)} {
		if errs := checkImagesPinned(map[string][]string{"x.yaml": {bad}}); len(errs) == 0 {
			t.Errorf("%q passed as pinned", bad)
		}
	}
}

func checkImagesPinned(refs map[string][]string) []string {
	var errs []string
	n := 0
	for file, list := range refs {
		for _, ref := range list {
			n++
			switch {
			case slices.Contains(builtHere, ref), slices.Contains(digestUnknown, ref):
			case !pinnedImage.MatchString(ref):
				errs = append(errs, file+": image "+ref+" is not pinned as name:tag@sha256:<digest>")
			}
		}
	}
	if n == 0 {
		errs = append(errs, "no image references found: is the scan broken?")
	}
	return errs
}

// TestNATSImageMatchesTestedServer: the NATS image the deploy files run is
// the same minor release as the nats-server module these tests parse and
// run the shipped configs with (deploy/go.mod). A patch release may differ
// (the image is pinned by digest, the module by go.sum); a minor release
// may change what a config means, so moving one without the other fails.
func TestNATSImageMatchesTestedServer(t *testing.T) {
	fsys := loadFiles(t)
	mod := natsModuleMinor(t)
	seen := 0
	for file, list := range imageRefs(t, fsys) {
		for _, ref := range list {
			if !strings.HasPrefix(ref, "nats:") {
				continue
			}
			seen++
			if got := imageMinor(ref); got != mod {
				t.Errorf("%s: image %s is NATS %s, the tests run nats-server %s", file, ref, got, mod)
			}
		}
	}
	if seen < 2 {
		t.Fatalf("found %d NATS images, want compose's and the chart's", seen)
	}
	if imageMinor("nats:2.14.7-alpine@sha256:"+strings.Repeat("a", 64)) != "2.14" {
		t.Error("imageMinor misreads a pinned tag")
	}
}

// natsModuleMinor is the major.minor of nats-server in deploy/go.mod.
func natsModuleMinor(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*github\.com/nats-io/nats-server/v2 v(\d+\.\d+)\.\d+`).FindSubmatch(b)
	if m == nil {
		t.Fatal("go.mod: no nats-server requirement")
	}
	return string(m[1])
}

// imageMinor is the major.minor of an image reference's tag.
func imageMinor(ref string) string {
	ref, _, _ = strings.Cut(ref, "@")
	_, tag, _ := strings.Cut(ref, ":")
	parts := strings.SplitN(tag, ".", 3)
	if len(parts) < 2 {
		return tag
	}
	return parts[0] + "." + parts[1]
}
