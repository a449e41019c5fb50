// Package jcs reads JSON the way the export's readers do and writes it back as RFC 8785
// canonical JSON (JCS), from the RFC and ECMA-262 alone.
//
// Values are nil, bool, Number, string, []any and *Object. Numbers keep their text, because
// an integer literal and a fractional one mean different things to the verifier: an event's
// seq must be an integer, and an integer beyond 2^53 is canonicalised as the double it denotes
// (what a JavaScript reader's JSON.parse makes of it), while a fraction is always a double.
//
// A string holding an escaped lone surrogate ("\ud800") is kept as its WTF-8 bytes: it is not
// valid UTF-8, so canonicalisation refuses it, as RFC 8785 requires.
package jcs

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
)

// Object is a JSON object: its member names in the order first seen, and their values (a
// repeated name keeps its first place and its last value).
type Object struct {
	Keys   []string
	Values map[string]any
}

// Get returns a member's value, and whether it is there.
func (o *Object) Get(name string) (any, bool) {
	value, ok := o.Values[name]
	return value, ok
}

// Value returns a member's value, nil when absent (JSON null and absence read alike).
func (o *Object) Value(name string) any {
	return o.Values[name]
}

// String returns a member's value if it is a string.
func (o *Object) String(name string) (string, bool) {
	value, ok := o.Values[name].(string)
	return value, ok
}

// Object returns a member's value if it is an object.
func (o *Object) Object(name string) (*Object, bool) {
	value, ok := o.Values[name].(*Object)
	return value, ok
}

// Without returns a copy of the object without the named members.
func (o *Object) Without(names ...string) *Object {
	out := &Object{Values: map[string]any{}}
	for _, key := range o.Keys {
		if contains(names, key) {
			continue
		}
		out.Keys = append(out.Keys, key)
		out.Values[key] = o.Values[key]
	}
	return out
}

func contains(names []string, name string) bool {
	for _, candidate := range names {
		if candidate == name {
			return true
		}
	}
	return false
}

// Number is a JSON number as written. The tokens NaN, Infinity and -Infinity, which the
// reference readers accept, are Numbers too; canonicalisation refuses them.
type Number string

// IsInteger reports whether the number was written as an integer (no fraction, no exponent):
// the only numbers a count or a seq may be.
func (n Number) IsInteger() bool {
	text := string(n)
	if text == "NaN" || strings.HasSuffix(text, "Infinity") {
		return false
	}
	return !strings.ContainsAny(text, ".eE")
}

// Integer returns the exact value of an integer-written number.
func (n Number) Integer() (*big.Int, bool) {
	if !n.IsInteger() {
		return nil, false
	}
	value, ok := new(big.Int).SetString(string(n), 10)
	return value, ok
}

// Float64 is the double the number denotes, correctly rounded (±Inf when out of range).
func (n Number) Float64() float64 {
	switch string(n) {
	case "NaN":
		return math.NaN()
	case "Infinity":
		return math.Inf(1)
	case "-Infinity":
		return math.Inf(-1)
	}
	value, err := strconv.ParseFloat(string(n), 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		panic(fmt.Sprintf("jcs: unparsed number %q", string(n)))
	}
	return value
}
