package jcs

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"math/big"
	"sort"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// maxSafeInteger is 2^53 - 1: integers within it are exact as doubles and are written as they
// are; beyond it an integer is the double it denotes, as a JavaScript reader sees it.
var maxSafeInteger = big.NewInt(1<<53 - 1)

// Canonical returns the RFC 8785 canonical UTF-8 bytes of a value.
func Canonical(value any) ([]byte, error) {
	var out strings.Builder
	if err := write(&out, value); err != nil {
		return nil, err
	}
	return []byte(out.String()), nil
}

// SHA256Hex is the lowercase hex SHA-256 of a value's canonical JSON.
func SHA256Hex(value any) (string, error) {
	canonical, err := Canonical(value)
	if err != nil {
		return "", err
	}
	digest := sha256.Sum256(canonical)
	return hex.EncodeToString(digest[:]), nil
}

func write(out *strings.Builder, value any) error {
	switch v := value.(type) {
	case nil:
		out.WriteString("null")
	case bool:
		out.WriteString(strconv.FormatBool(v))
	case Number:
		text, err := numberText(v)
		if err != nil {
			return err
		}
		out.WriteString(text)
	case string:
		return writeString(out, v)
	case []any:
		out.WriteByte('[')
		for i, item := range v {
			if i > 0 {
				out.WriteByte(',')
			}
			if err := write(out, item); err != nil {
				return err
			}
		}
		out.WriteByte(']')
	case *Object:
		// RFC 8785 §3.2.3: members sorted by the UTF-16 code units of their names, which is not
		// the order of their UTF-8 bytes once a name leaves the Basic Multilingual Plane.
		keys := append([]string(nil), v.Keys...)
		units := make(map[string][]uint16, len(keys))
		for _, key := range keys {
			units[key] = utf16.Encode([]rune(key))
		}
		sort.Slice(keys, func(i, j int) bool { return lessUnits(units[keys[i]], units[keys[j]]) })
		out.WriteByte('{')
		for i, key := range keys {
			if i > 0 {
				out.WriteByte(',')
			}
			if err := writeString(out, key); err != nil {
				return err
			}
			out.WriteByte(':')
			if err := write(out, v.Values[key]); err != nil {
				return err
			}
		}
		out.WriteByte('}')
	default:
		return fmt.Errorf("%T is not a JSON value", value)
	}
	return nil
}

func lessUnits(a, b []uint16) bool {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return len(a) < len(b)
}

// writeString escapes as ECMAScript's JSON.stringify does (RFC 8785 §3.2.2.2): the two-letter
// forms for \b \f \n \r \t " and \, \u00xx for the other controls, everything else as itself.
func writeString(out *strings.Builder, text string) error {
	if !utf8.ValidString(text) {
		return fmt.Errorf("a lone surrogate is not valid Unicode")
	}
	out.WriteByte('"')
	for _, r := range text {
		switch r {
		case '"':
			out.WriteString(`\"`)
		case '\\':
			out.WriteString(`\\`)
		case '\b':
			out.WriteString(`\b`)
		case '\f':
			out.WriteString(`\f`)
		case '\n':
			out.WriteString(`\n`)
		case '\r':
			out.WriteString(`\r`)
		case '\t':
			out.WriteString(`\t`)
		default:
			if r < 0x20 {
				fmt.Fprintf(out, `\u%04x`, r)
			} else {
				out.WriteRune(r)
			}
		}
	}
	out.WriteByte('"')
	return nil
}

func numberText(n Number) (string, error) {
	if integer, ok := n.Integer(); ok {
		if integer.CmpAbs(maxSafeInteger) <= 0 {
			return integer.String(), nil
		}
		// Nearest double, ties to even; past the largest double it is infinite and refused.
		double, _ := new(big.Float).SetInt(integer).Float64()
		if math.IsInf(double, 0) {
			return "", fmt.Errorf("%s is outside the range of a double", integer)
		}
		return FormatDouble(double)
	}
	return FormatDouble(n.Float64())
}

// FormatDouble writes a double as ECMAScript's Number::toString does (ECMA-262, Number::toString
// with radix 10; RFC 8785 §3.2.2.3). NaN and the infinities have no JSON form.
func FormatDouble(value float64) (string, error) {
	if math.IsNaN(value) || math.IsInf(value, 0) {
		return "", fmt.Errorf("%s is not a JSON number", map[bool]string{true: "nan", false: infinity(value)}[math.IsNaN(value)])
	}
	if value == 0 {
		return "0", nil // -0 as well
	}
	sign := ""
	if value < 0 {
		sign, value = "-", -value
	}
	// The shortest digits that read back as this double (the spec's "k as small as
	// possible"), and n, where value = 0.digits × 10^n.
	scientific := strconv.FormatFloat(value, 'e', -1, 64)
	mantissa, exponent, _ := strings.Cut(scientific, "e")
	digits := strings.Replace(mantissa, ".", "", 1)
	power, err := strconv.Atoi(exponent)
	if err != nil {
		return "", err
	}
	k, n := len(digits), power+1
	var text string
	switch {
	case k <= n && n <= 21:
		text = digits + strings.Repeat("0", n-k)
	case 0 < n && n <= 21:
		text = digits[:n] + "." + digits[n:]
	case -6 < n && n <= 0:
		text = "0." + strings.Repeat("0", -n) + digits
	default:
		e := n - 1
		sign := "+"
		if e < 0 {
			sign, e = "-", -e
		}
		lead := digits[:1]
		if k > 1 {
			lead += "." + digits[1:]
		}
		text = lead + "e" + sign + strconv.Itoa(e)
	}
	return sign + text, nil
}

func infinity(value float64) string {
	if value < 0 {
		return "-inf"
	}
	return "inf"
}
