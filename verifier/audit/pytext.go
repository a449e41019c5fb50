package audit

// The reference verifier is written in Python and its messages quote values as Python shows
// them (str() and repr()), and compares them as Python does (1 == 1.0 == True). An auditor
// comparing the two verifiers' verdicts should see the same words, so this file renders and
// compares JSON values by those rules.

import (
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/agent-backplane/verifier/jcs"
)

// pyStr renders a JSON value as Python's str() renders what json.loads made of it.
func pyStr(value any) string {
	if text, ok := value.(string); ok {
		return text
	}
	return pyRepr(value)
}

// pyRepr renders a JSON value as Python's repr().
func pyRepr(value any) string {
	switch v := value.(type) {
	case nil:
		return "None"
	case bool:
		if v {
			return "True"
		}
		return "False"
	case jcs.Number:
		if integer, ok := v.Integer(); ok {
			return integer.String()
		}
		return pyFloat(v.Float64())
	case string:
		return pyStringRepr(v)
	case []any:
		items := make([]string, len(v))
		for i, item := range v {
			items[i] = pyRepr(item)
		}
		return "[" + strings.Join(items, ", ") + "]"
	case *jcs.Object:
		items := make([]string, len(v.Keys))
		for i, key := range v.Keys {
			items[i] = pyStringRepr(key) + ": " + pyRepr(v.Values[key])
		}
		return "{" + strings.Join(items, ", ") + "}"
	}
	return fmt.Sprint(value)
}

// pyFloat is Python's repr of a float: the shortest round-tripping digits, positional from
// 1e-4 up to 1e16, else with a signed exponent of at least two digits.
func pyFloat(value float64) string {
	switch {
	case math.IsNaN(value):
		return "nan"
	case math.IsInf(value, 1):
		return "inf"
	case math.IsInf(value, -1):
		return "-inf"
	}
	scientific := strconv.FormatFloat(value, 'e', -1, 64)
	mantissa, exponentText, _ := strings.Cut(scientific, "e")
	exponent, _ := strconv.Atoi(exponentText)
	if -4 <= exponent && exponent < 16 {
		text := strconv.FormatFloat(value, 'f', -1, 64)
		if !strings.Contains(text, ".") {
			text += ".0"
		}
		return text
	}
	sign := "+"
	if exponent < 0 {
		sign, exponent = "-", -exponent
	}
	return fmt.Sprintf("%se%s%02d", mantissa, sign, exponent)
}

// pyStringRepr quotes as Python does: single quotes unless the text has one and no double
// quote, backslash escapes for the quote, the backslash and \t \n \r, and hex escapes for
// what is not printable.
func pyStringRepr(text string) string {
	quote := byte('\'')
	if strings.Contains(text, "'") && !strings.Contains(text, `"`) {
		quote = '"'
	}
	var out strings.Builder
	out.WriteByte(quote)
	for i := 0; i < len(text); {
		r, width := utf8.DecodeRuneInString(text[i:])
		if r == utf8.RuneError && width <= 1 {
			// A lone surrogate, kept as WTF-8 by the reader: Python shows it as \udxxx.
			if i+3 <= len(text) && text[i] == 0xed {
				unit := rune(text[i]&0x0f)<<12 | rune(text[i+1]&0x3f)<<6 | rune(text[i+2]&0x3f)
				fmt.Fprintf(&out, `\u%04x`, unit)
				i += 3
				continue
			}
			fmt.Fprintf(&out, `\x%02x`, text[i])
			i++
			continue
		}
		i += width
		switch {
		case r == rune(quote) || r == '\\':
			out.WriteByte('\\')
			out.WriteRune(r)
		case r == '\t':
			out.WriteString(`\t`)
		case r == '\n':
			out.WriteString(`\n`)
		case r == '\r':
			out.WriteString(`\r`)
		case unicode.IsPrint(r):
			out.WriteRune(r)
		case r < 0x100:
			fmt.Fprintf(&out, `\x%02x`, r)
		case r < 0x10000:
			fmt.Fprintf(&out, `\u%04x`, r)
		default:
			fmt.Fprintf(&out, `\U%08x`, r)
		}
	}
	out.WriteByte(quote)
	return out.String()
}

// pyEqual compares JSON values as Python compares what json.loads made of them: numbers by
// value whatever their spelling (and true as 1, false as 0), containers member by member.
func pyEqual(a, b any) bool {
	if x, ok := pyNumber(a); ok {
		y, ok := pyNumber(b)
		return ok && x.equal(y)
	}
	switch v := a.(type) {
	case nil:
		return b == nil
	case string:
		w, ok := b.(string)
		return ok && v == w
	case []any:
		w, ok := b.([]any)
		if !ok || len(v) != len(w) {
			return false
		}
		for i := range v {
			if !pyEqual(v[i], w[i]) {
				return false
			}
		}
		return true
	case *jcs.Object:
		w, ok := b.(*jcs.Object)
		if !ok || len(v.Values) != len(w.Values) {
			return false
		}
		for key, member := range v.Values {
			other, present := w.Values[key]
			if !present || !pyEqual(member, other) {
				return false
			}
		}
		return true
	}
	return false
}

// pyNumeric is an int (exact) or a float, as Python holds a JSON number or a bool.
type pyNumeric struct {
	integer *big.Int
	float   float64
}

func pyNumber(value any) (pyNumeric, bool) {
	switch v := value.(type) {
	case bool:
		if v {
			return pyNumeric{integer: big.NewInt(1)}, true
		}
		return pyNumeric{integer: big.NewInt(0)}, true
	case jcs.Number:
		if integer, ok := v.Integer(); ok {
			return pyNumeric{integer: integer}, true
		}
		return pyNumeric{float: v.Float64()}, true
	}
	return pyNumeric{}, false
}

func (x pyNumeric) equal(y pyNumeric) bool {
	if x.integer != nil && y.integer != nil {
		return x.integer.Cmp(y.integer) == 0
	}
	if x.integer == nil && y.integer == nil {
		return x.float == y.float
	}
	if x.integer == nil {
		x, y = y, x
	}
	// An int against a float: equal only when the float is finite and exactly that integer.
	if math.IsNaN(y.float) || math.IsInf(y.float, 0) {
		return false
	}
	exact := new(big.Rat).SetFloat64(y.float)
	return exact.Cmp(new(big.Rat).SetInt(x.integer)) == 0
}

// asCount is Python's `type(value) is int and value >= 0`: an integer literal, never a bool
// or a float, that is not negative and fits the verifier's arithmetic.
func asCount(value any) (uint64, bool) {
	number, ok := value.(jcs.Number)
	if !ok {
		return 0, false
	}
	integer, ok := number.Integer()
	if !ok || integer.Sign() < 0 || !integer.IsUint64() {
		return 0, false
	}
	return integer.Uint64(), true
}

func isLowerHex(value any, length int) bool {
	text, ok := value.(string)
	if !ok || len(text) != length {
		return false
	}
	for i := 0; i < len(text); i++ {
		c := text[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
