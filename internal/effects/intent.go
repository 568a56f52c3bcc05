package effects

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"unicode/utf8"
)

// Limits on a ledger intent.
const (
	// MaxAmount is the largest amount one intent may move, in minor units.
	MaxAmount = 1_000_000_000
	// MaxIntentSize is the largest payload accepted, in bytes.
	MaxIntentSize = 4096
)

// ErrBadIntent wraps every reason an intent's payload is refused. The
// [Ledger] hands such errors to the inbox marked with [inbox.BadInput].
var ErrBadIntent = errors.New("effects: bad intent")

// Intent moves Amount (minor units, 1..MaxAmount) into Account. Its JSON form
// is exactly {"account":<int>,"amount":<int>}.
type Intent struct {
	Account int64
	Amount  int64
}

// AppendJSON appends the intent's canonical JSON encoding to dst.
func (in Intent) AppendJSON(dst []byte) []byte {
	dst = append(dst, `{"account":`...)
	dst = strconv.AppendInt(dst, in.Account, 10)
	dst = append(dst, `,"amount":`...)
	dst = strconv.AppendInt(dst, in.Amount, 10)
	return append(dst, '}')
}

// ParseIntent decodes and validates a payload strictly: one JSON object with
// exactly the keys "account" and "amount" (case-sensitive, each once, no
// escapes), integer values, nothing after the object, valid UTF-8. Every
// refusal wraps [ErrBadIntent] and says why.
func ParseIntent(b []byte) (Intent, error) {
	var in Intent
	if len(b) > MaxIntentSize {
		return in, badf("payload of %d bytes exceeds %d", len(b), MaxIntentSize)
	}
	if !utf8.Valid(b) {
		return in, badf("payload is not valid UTF-8")
	}
	p := parser{b: b}
	p.ws()
	if !p.eat('{') {
		return in, badf("payload is not a JSON object")
	}
	var haveAccount, haveAmount bool
	p.ws()
	if p.eat('}') {
		return in, badf("missing field \"account\"")
	}
	for {
		p.ws()
		key, err := p.key()
		if err != nil {
			return in, err
		}
		p.ws()
		if !p.eat(':') {
			return in, badf("expected ':' after key %q at byte %d", key, p.i)
		}
		p.ws()
		switch string(key) {
		case "account":
			if haveAccount {
				return in, badf("duplicate key \"account\"")
			}
			haveAccount = true
			if in.Account, err = p.int("account"); err != nil {
				return in, err
			}
		case "amount":
			if haveAmount {
				return in, badf("duplicate key \"amount\"")
			}
			haveAmount = true
			if in.Amount, err = p.int("amount"); err != nil {
				return in, err
			}
		default:
			return in, badf("unknown field %q (fields are case-sensitive: \"account\", \"amount\")", key)
		}
		p.ws()
		if p.eat(',') {
			continue
		}
		if p.eat('}') {
			break
		}
		return in, badf("expected ',' or '}' at byte %d", p.i)
	}
	p.ws()
	if p.i != len(b) {
		return in, badf("trailing data after the JSON object at byte %d", p.i)
	}
	switch {
	case !haveAccount:
		return in, badf("missing field \"account\"")
	case !haveAmount:
		return in, badf("missing field \"amount\"")
	case in.Account <= 0:
		return in, badf("account %d is not a positive account ID", in.Account)
	case in.Amount <= 0:
		return in, badf("amount %d must be positive", in.Amount)
	case in.Amount > MaxAmount:
		return in, badf("amount %d exceeds the limit of %d", in.Amount, MaxAmount)
	}
	return in, nil
}

func badf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrBadIntent}, args...)...)
}

type parser struct {
	b []byte
	i int
}

func (p *parser) ws() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *parser) eat(c byte) bool {
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

func (p *parser) key() ([]byte, error) {
	if !p.eat('"') {
		return nil, badf("expected a quoted key at byte %d", p.i)
	}
	start := p.i
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			k := p.b[start:p.i]
			p.i++
			return k, nil
		case c == '\\':
			return nil, badf("escaped characters in keys are not accepted (byte %d)", p.i)
		case c < 0x20:
			return nil, badf("control character in key at byte %d", p.i)
		}
		p.i++
	}
	return nil, badf("unterminated key")
}

func (p *parser) int(key string) (int64, error) { // key is a constant: no allocation
	start := p.i
	if p.i < len(p.b) && p.b[p.i] == '-' {
		p.i++
	}
	digits := p.i
	for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
		p.i++
	}
	if p.i == digits {
		if start < len(p.b) {
			return 0, badf("%q must be an integer, got %s", key, describe(p.b[start]))
		}
		return 0, badf("%q has no value", key)
	}
	if p.i < len(p.b) {
		switch p.b[p.i] {
		case '.', 'e', 'E':
			return 0, badf("%q must be an integer, got a fraction or exponent", key)
		}
	}
	if p.i-digits > 1 && p.b[digits] == '0' {
		return 0, badf("%q has a leading zero", key)
	}
	// Accumulate as a negative number so that math.MinInt64 fits.
	var v int64
	for _, c := range p.b[digits:p.i] {
		d := int64(c - '0')
		if v < (math.MinInt64+d)/10 {
			return 0, badf("%q is out of range: %s", key, p.b[start:p.i])
		}
		v = v*10 - d
	}
	if digits == start { // no minus sign
		if v == math.MinInt64 {
			return 0, badf("%q is out of range: %s", key, p.b[start:p.i])
		}
		v = -v
	}
	return v, nil
}

func describe(c byte) string {
	switch c {
	case '"':
		return "a string"
	case '{':
		return "an object"
	case '[':
		return "an array"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return fmt.Sprintf("%q", c)
}
