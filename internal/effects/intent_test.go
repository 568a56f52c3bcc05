package effects

import (
	"errors"
	"strings"
	"testing"
)

func TestParseIntentStrict(t *testing.T) {
	t.Parallel()
	deep := strings.Repeat("[", 1000) + strings.Repeat("]", 1000)
	cases := []struct {
		name, in, reason string
	}{
		{"malformed", `{"account":1,`, "expected a quoted key"},
		{"not an object", `[1,2]`, "not a JSON object"},
		{"unknown field", `{"account":1,"amount":5,"memo":"x"}`, `unknown field "memo"`},
		{"case-variant key", `{"Account":1,"amount":5}`, `unknown field "Account"`},
		{"duplicate key", `{"account":1,"amount":5,"amount":6}`, `duplicate key "amount"`},
		{"escaped key", `{"\u0061ccount":1,"amount":5}`, "escaped characters"},
		{"string amount", `{"account":1,"amount":"5"}`, `"amount" must be an integer, got a string`},
		{"bool account", `{"account":true,"amount":5}`, "got a boolean"},
		{"null amount", `{"account":1,"amount":null}`, "got null"},
		{"fraction", `{"account":1,"amount":5.5}`, "fraction or exponent"},
		{"exponent", `{"account":1,"amount":5e3}`, "fraction or exponent"},
		{"leading zero", `{"account":1,"amount":05}`, "leading zero"},
		{"zero amount", `{"account":1,"amount":0}`, "must be positive"},
		{"negative amount", `{"account":1,"amount":-5}`, "must be positive"},
		{"huge amount", `{"account":1,"amount":1000000001}`, "exceeds the limit"},
		{"overflow", `{"account":1,"amount":99999999999999999999999}`, "out of range"},
		{"negative account", `{"account":-1,"amount":5}`, "not a positive account ID"},
		{"missing amount", `{"account":1}`, `missing field "amount"`},
		{"empty object", `{}`, `missing field "account"`},
		{"trailing garbage", `{"account":1,"amount":5}x`, "trailing data"},
		{"two objects", `{"account":1,"amount":5}{}`, "trailing data"},
		{"deep nesting", `{"account":` + deep + `,"amount":5}`, "got an array"},
		{"invalid utf-8", "{\"account\":1,\"amount\":5,\"\xff\":1}", "not valid UTF-8"},
		{"oversized", `{"account":1,"amount":5}` + strings.Repeat(" ", MaxIntentSize), "exceeds 4096"},
		{"empty", ``, "not a JSON object"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseIntent([]byte(c.in))
			if !errors.Is(err, ErrBadIntent) || !strings.Contains(err.Error(), c.reason) {
				t.Fatalf("ParseIntent(%.40q) = %v, want ErrBadIntent with %q", c.in, err, c.reason)
			}
		})
	}
}

func TestParseIntentRoundTrip(t *testing.T) {
	t.Parallel()
	for _, in := range []Intent{{1, 1}, {1024, MaxAmount}, {9, 12345}} {
		got, err := ParseIntent(in.AppendJSON(nil))
		if err != nil || got != in {
			t.Fatalf("round trip %+v: %+v, %v", in, got, err)
		}
	}
	got, err := ParseIntent([]byte(" {\n\t\"amount\" : 7 , \"account\":3 }\r\n"))
	if err != nil || got != (Intent{Account: 3, Amount: 7}) {
		t.Fatalf("whitespace and key order: %+v, %v", got, err)
	}
}

func FuzzParseIntent(f *testing.F) {
	f.Add([]byte(`{"account":1,"amount":5}`))
	f.Add([]byte(`{"account":1,"amount":5,"amount":5}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		in, err := ParseIntent(b)
		if err != nil {
			return
		}
		again, err := ParseIntent(in.AppendJSON(nil))
		if err != nil || again != in {
			t.Fatalf("accepted %q as %+v but its canonical form fails: %v", b, in, err)
		}
	})
}

func BenchmarkParseIntent(b *testing.B) {
	p := Intent{Account: 1017, Amount: 123456}.AppendJSON(nil)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseIntent(p); err != nil {
			b.Fatal(err)
		}
	}
}
