package jittersim

import (
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// series is one panel of the chart: requests per bucket, counts[i] for bucket first+i.
type series struct {
	title  string
	first  int64
	counts []int
}

// WriteChart draws requests per bucket over time, one panel per policy: the retry storm's
// rows on the left, the overloaded server's on the right, the same policy side by side (the
// last storm row, backoff/v4, beside the last overloaded row). Time runs on a log scale, so that
// no jitter's spikes and the jittered kinds' first second both show; each panel scales its own
// y axis. The format follows path's extension: ".png" for PNG, anything else SVG.
func WriteChart(path string, c Config, rows []Row, results []Result) error {
	n := max(len(rows), len(results))
	grid := make([][]*plot.Plot, n)
	left := make([]series, n)
	right := make([]series, n)
	for i, r := range rows {
		at := i
		if i == len(rows)-1 {
			at = n - 1
		}
		left[at] = series{fmt.Sprintf("storm: %s, peak %d", r.Name, r.Peak), r.First, r.Buckets}
	}
	for i, r := range results {
		right[i] = series{fmt.Sprintf("overloaded: %s, peak %d, done %.2f s", r.Name, r.Peak, r.Done.Seconds()), 0, r.Buckets}
	}
	lx, rx := xRange(left, c), xRange(right, c)
	for i := range grid {
		grid[i] = make([]*plot.Plot, 2)
		for j, s := range []series{left[i], right[i]} {
			if s.counts == nil {
				continue
			}
			p, err := panel(s, c, []xr{lx, rx}[j], i)
			if err != nil {
				return err
			}
			grid[i][j] = p
		}
	}

	w, h := 30*vg.Centimeter, vg.Length(n)*6*vg.Centimeter
	var canvas interface {
		vg.CanvasSizer
		io.WriterTo
	}
	if strings.EqualFold(filepath.Ext(path), ".png") {
		canvas = vgimg.PngCanvas{Canvas: vgimg.New(w, h)}
	} else {
		canvas = vgsvg.New(w, h)
	}
	tiles := draw.Tiles{Rows: n, Cols: 2, PadX: vg.Centimeter, PadY: vg.Centimeter / 2,
		PadTop: vg.Centimeter / 4, PadBottom: vg.Centimeter / 4, PadLeft: vg.Centimeter / 4, PadRight: vg.Centimeter / 2}
	canvases := plot.Align(grid, tiles, draw.New(canvas))
	for i, row := range grid {
		for j, p := range row {
			if p != nil {
				p.Draw(canvases[i][j])
			}
		}
	}

	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("jittersim: chart: %w", err)
	}
	if _, err := canvas.WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("jittersim: chart: write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("jittersim: chart: %w", err)
	}
	return nil
}

// xr is a column's common time range in seconds.
type xr struct{ min, max float64 }

func xRange(col []series, c Config) xr {
	r := xr{math.Inf(1), math.Inf(-1)}
	for _, s := range col {
		if len(s.counts) == 0 {
			continue
		}
		r.min = min(r.min, x(s.first, c))
		r.max = max(r.max, x(s.first+int64(len(s.counts))-1, c))
	}
	return r
}

// x is the time at the end of bucket b, in seconds: never zero, as the log scale needs.
func x(b int64, c Config) float64 { return float64(b+1) * c.Bucket.Seconds() }

func panel(s series, c Config, r xr, i int) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = s.title
	p.X.Label.Text = "seconds since the failure (log scale)"
	p.Y.Label.Text = fmt.Sprintf("requests per %v", c.Bucket)
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.X.Min, p.X.Max = r.min, r.max
	p.Add(plotter.NewGrid())
	l, err := plotter.NewLine(points(s, c))
	if err != nil {
		return nil, fmt.Errorf("jittersim: chart %q: %w", s.title, err)
	}
	l.Color = plotutil.Color(i)
	l.Width = vg.Points(0.8)
	p.Add(l)
	p.Y.Min = 0
	return p, nil
}

// points returns the polyline of s, keeping only the ends of every run of equal counts: the
// same drawing, far fewer points.
func points(s series, c Config) plotter.XYs {
	var xy plotter.XYs
	for i, n := range s.counts {
		if i > 0 && i < len(s.counts)-1 && n == s.counts[i-1] && n == s.counts[i+1] {
			continue
		}
		xy = append(xy, plotter.XY{X: x(s.first+int64(i), c), Y: float64(n)})
	}
	return xy
}
