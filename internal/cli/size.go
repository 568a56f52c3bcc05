package cli

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Size is a byte count flag: plain bytes, or a number with a unit, binary
// (KiB, MiB, GiB, TiB) or decimal (KB, MB, GB, TB). Zero means the default.
type Size int64

var sizeUnits = []struct {
	suffix string
	mult   float64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1},
}

// String renders the size with the largest binary unit that divides it.
func (s *Size) String() string {
	v := int64(*s)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if v != 0 && v%u.mult == 0 {
			return strconv.FormatInt(v/u.mult, 10) + u.suffix
		}
	}
	return strconv.FormatInt(v, 10)
}

// Set parses a size such as 16GiB, 1.5GB or 1048576.
func (s *Size) Set(v string) error {
	n, err := ParseSize(v)
	if err != nil {
		return err
	}
	*s = Size(n)
	return nil
}

// ParseSize parses a size such as 16GiB, 1.5GB or 1048576 into bytes.
func ParseSize(v string) (int64, error) {
	t := strings.TrimSpace(v)
	mult := 1.0
	for _, u := range sizeUnits {
		if len(t) > len(u.suffix) && strings.EqualFold(t[len(t)-len(u.suffix):], u.suffix) {
			t, mult = strings.TrimSpace(t[:len(t)-len(u.suffix)]), u.mult
			break
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || f < 0 || math.IsNaN(f) || f*mult > math.MaxInt64 {
		return 0, fmt.Errorf("size %q: want bytes, or a number with KiB, MiB, GiB, TiB (or KB, MB, GB, TB)", v)
	}
	return int64(f * mult), nil
}

// envSize reads a size from the environment for a flag default; a value
// that does not parse is reported through errs.
func envSize(env Env, name string, errs *[]error) Size {
	v := env(name)
	if v == "" {
		return 0
	}
	n, err := ParseSize(v)
	if err != nil {
		*errs = append(*errs, fmt.Errorf("%s: %w", name, err))
	}
	return Size(n)
}
