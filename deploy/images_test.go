package deploy_test

import (
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
// deployment. The list may only shrink.
var digestUnknown = []string{"nats:2.15.2-alpine", "prom/prometheus:v3.16.0"}

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
