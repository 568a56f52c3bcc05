package console

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/chromedp/chromedp"
)

// Shot is one page to photograph: Path under the console's URL, then, if
// Follow is set, the first link matching that CSS selector.
type Shot struct {
	Name   string
	Path   string
	Follow string
}

// DefaultShots are the pages the docs show.
func DefaultShots(sharded bool) []Shot {
	s := []Shot{
		{Name: "overview", Path: ""},
		{Name: "dead-letters", Path: "dlq"},
		{Name: "dead-letter", Path: "dlq", Follow: `#letters a[href*="dlq/show"]`},
		{Name: "intent", Path: "dlq", Follow: `#letters a[href*="intent?id="]`},
		{Name: "verify", Path: "verify?run=1"},
	}
	if sharded {
		s = append(s, Shot{Name: "partitions", Path: "partitions"})
	}
	return s
}

// ChromiumPath finds the Chromium binary (Debian's chromium, or
// $CHROMIUM), or returns "".
func ChromiumPath() string {
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p
	}
	for _, n := range []string{"chromium", "chromium-browser", "google-chrome", "headless-shell"} {
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
	}
	return ""
}

// Browser starts a headless Chromium for chromedp and returns its context;
// cancel ends it.
func Browser(ctx context.Context) (context.Context, context.CancelFunc, error) {
	path := ChromiumPath()
	if path == "" {
		return nil, nil, fmt.Errorf("console: no chromium found (apt-get install chromium, or set CHROMIUM)")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox,
		chromedp.DisableGPU, chromedp.Flag("disable-dev-shm-usage", true), chromedp.WindowSize(1280, 900),
		chromedp.Flag("no-proxy-server", true))
	actx, acancel := chromedp.NewExecAllocator(ctx, opts...)
	bctx, bcancel := chromedp.NewContext(actx)
	if err := chromedp.Do(bctx); err != nil {
		bcancel()
		acancel()
		return nil, nil, fmt.Errorf("console: start %s: %w", path, err)
	}
	return bctx, func() { bcancel(); acancel() }, nil
}

// Screenshots photographs each shot of the console at base (its URL,
// ending in /) into dir as NAME.png.
func Screenshots(ctx context.Context, base, dir string, shots []Shot, w io.Writer) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	bctx, cancel, err := Browser(ctx)
	if err != nil {
		return err
	}
	defer cancel()
	for _, s := range shots {
		tctx, tcancel := context.WithTimeout(bctx, time.Minute)
		png, err := shoot(tctx, strings.TrimSuffix(base, "/")+"/"+s.Path, s.Follow)
		tcancel()
		if err != nil {
			return fmt.Errorf("console: screenshot %s: %w", s.Name, err)
		}
		p := filepath.Join(dir, s.Name+".png")
		if err := os.WriteFile(p, png, 0o644); err != nil {
			return err
		}
		fmt.Fprintf(w, "wrote %s\n", p)
	}
	return nil
}

func shoot(ctx context.Context, url, follow string) ([]byte, error) {
	acts := []chromedp.Action[chromedp.Void]{chromedp.Navigate(url), chromedp.WaitReady(chromedp.CSS("main"))}
	if follow != "" {
		acts = append(acts, chromedp.Click(chromedp.CSS(follow), chromedp.NodeVisible), chromedp.WaitReady(chromedp.CSS("main h1")))
	}
	if err := chromedp.Do(ctx, acts...); err != nil {
		return nil, err
	}
	return chromedp.Run(ctx, chromedp.FullScreenshot(100)) // 100: PNG; less is JPEG
}
