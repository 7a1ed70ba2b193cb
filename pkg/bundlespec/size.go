package bundlespec

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"regexp"
	"strconv"
	"strings"
)

// Size is a number of bytes. In YAML it is written as a whole number of bytes with an optional unit
// (see ParseSize) and rendered by String.
type Size uint64

// MaxSize is the largest Size ParseSize accepts (the largest int64, so that it fits io and os APIs).
const MaxSize Size = math.MaxInt64

// sizeUnits are the units ParseSize accepts, largest first within each family: IEC binary prefixes
// (KiB = 1024 bytes) and SI decimal prefixes (kB = 1000 bytes; "KB" is accepted for kB).
var sizeUnits = []struct {
	name   string
	factor uint64
}{
	{"TiB", 1 << 40}, {"TB", 1e12},
	{"GiB", 1 << 30}, {"GB", 1e9},
	{"MiB", 1 << 20}, {"MB", 1e6},
	{"KiB", 1 << 10}, {"kB", 1e3},
}

// sizeRE is a decimal number (digits, optional fraction) and an optional unit, optionally separated
// by one space.
var sizeRE = regexp.MustCompile(`^([0-9]+)(\.[0-9]+)? ?([A-Za-z]*)$`)

// ErrSize is wrapped by every error of ParseSize.
var ErrSize = errors.New("not a size")

// sizeHint is appended to size errors.
const sizeHint = "write a whole number of bytes with an optional unit, e.g. 4GiB, 700MB or 4.7GB (units B, kB, MB, GB, TB = powers of 1000; KiB, MiB, GiB, TiB = powers of 1024)"

// ParseSize parses a size: a decimal number, optionally with a fraction, and an optional unit — B,
// kB (or KB), MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024), case-sensitive,
// optionally after one space: "4GiB", "4.7GB", "700 MB", "1048576". The result must be a whole number
// of bytes no larger than MaxSize. Errors wrap ErrSize.
func ParseSize(s string) (Size, error) {
	if len(s) > 40 {
		return 0, fmt.Errorf("%w: too long", ErrSize)
	}
	m := sizeRE.FindStringSubmatch(s)
	if m == nil {
		return 0, fmt.Errorf("%w: %s", ErrSize, sizeHint)
	}
	factor := uint64(1)
	switch unit := m[3]; unit {
	case "", "B":
	case "KB":
		factor = 1e3
	default:
		found := false
		for _, u := range sizeUnits {
			if u.name == unit {
				factor, found = u.factor, true
				break
			}
		}
		if !found {
			for _, u := range sizeUnits {
				if strings.EqualFold(u.name, unit) {
					return 0, fmt.Errorf("%w: unknown unit %q (units are case-sensitive): did you mean %q?", ErrSize, unit, u.name)
				}
			}
			return 0, fmt.Errorf("%w: unknown unit %q: %s", ErrSize, unit, sizeHint)
		}
	}
	num, ok := new(big.Rat).SetString(m[1] + m[2])
	if !ok { // unreachable: the regexp admits only decimal numbers
		return 0, fmt.Errorf("%w: %s", ErrSize, sizeHint)
	}
	num.Mul(num, new(big.Rat).SetInt(new(big.Int).SetUint64(factor)))
	if !num.IsInt() {
		return 0, fmt.Errorf("%w: it is not a whole number of bytes (%s bytes)", ErrSize, num.FloatString(3))
	}
	n := num.Num()
	if !n.IsUint64() || n.Uint64() > uint64(MaxSize) {
		return 0, fmt.Errorf("%w: larger than %d bytes", ErrSize, uint64(MaxSize))
	}
	return Size(n.Uint64()), nil
}

// String renders s in the largest unit that divides it exactly ("4GiB", "4700MB"), or as a plain
// number of bytes ("1000001"); ParseSize(s.String()) == s.
func (s Size) String() string {
	if s != 0 {
		for _, u := range sizeUnits {
			if uint64(s)%u.factor == 0 {
				return strconv.FormatUint(uint64(s)/u.factor, 10) + u.name
			}
		}
	}
	return strconv.FormatUint(uint64(s), 10)
}

// MarshalYAML renders s as String does: a string with a unit, or an integer number of bytes.
func (s Size) MarshalYAML() (any, error) {
	str := s.String()
	if n, err := strconv.ParseUint(str, 10, 64); err == nil {
		return n, nil
	}
	return str, nil
}
