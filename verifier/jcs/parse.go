package jcs

import (
	"fmt"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// Parse reads one JSON text (RFC 8259, surrounded by optional whitespace). Like the reference
// readers it also takes the tokens NaN, Infinity and -Infinity, and escaped lone surrogates;
// it refuses bytes that are not UTF-8 and raw control characters inside strings.
func Parse(data []byte) (any, error) {
	if !utf8.Valid(data) {
		return nil, fmt.Errorf("not UTF-8")
	}
	return parseText(string(data))
}

func parseText(text string) (any, error) {
	p := &parser{text: text}
	p.skipSpace()
	value, err := p.value(0)
	if err != nil {
		return nil, err
	}
	p.skipSpace()
	if p.pos != len(p.text) {
		return nil, p.errorf("extra data")
	}
	return value, nil
}

// maxDepth bounds nesting, so that a hostile file cannot exhaust the stack.
const maxDepth = 1000

type parser struct {
	text string
	pos  int
}

func (p *parser) errorf(format string, args ...any) error {
	return fmt.Errorf("%s at char %d", fmt.Sprintf(format, args...), p.pos)
}

func (p *parser) skipSpace() {
	for p.pos < len(p.text) {
		switch p.text[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

func (p *parser) literal(word string) bool {
	if strings.HasPrefix(p.text[p.pos:], word) {
		p.pos += len(word)
		return true
	}
	return false
}

func (p *parser) value(depth int) (any, error) {
	if depth > maxDepth {
		return nil, p.errorf("nested too deeply")
	}
	if p.pos >= len(p.text) {
		return nil, p.errorf("expecting a value")
	}
	switch c := p.text[p.pos]; {
	case c == '{':
		return p.object(depth)
	case c == '[':
		return p.array(depth)
	case c == '"':
		return p.string()
	case p.literal("null"):
		return nil, nil
	case p.literal("true"):
		return true, nil
	case p.literal("false"):
		return false, nil
	case p.literal("NaN"):
		return Number("NaN"), nil
	case p.literal("Infinity"):
		return Number("Infinity"), nil
	case p.literal("-Infinity"):
		return Number("-Infinity"), nil
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number()
	}
	return nil, p.errorf("expecting a value")
}

func (p *parser) object(depth int) (any, error) {
	p.pos++ // {
	object := &Object{Values: map[string]any{}}
	p.skipSpace()
	if p.pos < len(p.text) && p.text[p.pos] == '}' {
		p.pos++
		return object, nil
	}
	for {
		p.skipSpace()
		if p.pos >= len(p.text) || p.text[p.pos] != '"' {
			return nil, p.errorf("expecting a property name in double quotes")
		}
		key, err := p.string()
		if err != nil {
			return nil, err
		}
		p.skipSpace()
		if p.pos >= len(p.text) || p.text[p.pos] != ':' {
			return nil, p.errorf("expecting ':'")
		}
		p.pos++
		p.skipSpace()
		member, err := p.value(depth + 1)
		if err != nil {
			return nil, err
		}
		name := key.(string)
		if _, seen := object.Values[name]; !seen {
			object.Keys = append(object.Keys, name)
		}
		object.Values[name] = member
		p.skipSpace()
		if p.pos < len(p.text) && p.text[p.pos] == ',' {
			p.pos++
			continue
		}
		if p.pos < len(p.text) && p.text[p.pos] == '}' {
			p.pos++
			return object, nil
		}
		return nil, p.errorf("expecting ',' or '}'")
	}
}

func (p *parser) array(depth int) (any, error) {
	p.pos++ // [
	items := []any{}
	p.skipSpace()
	if p.pos < len(p.text) && p.text[p.pos] == ']' {
		p.pos++
		return items, nil
	}
	for {
		p.skipSpace()
		item, err := p.value(depth + 1)
		if err != nil {
			return nil, err
		}
		items = append(items, item)
		p.skipSpace()
		if p.pos < len(p.text) && p.text[p.pos] == ',' {
			p.pos++
			continue
		}
		if p.pos < len(p.text) && p.text[p.pos] == ']' {
			p.pos++
			return items, nil
		}
		return nil, p.errorf("expecting ',' or ']'")
	}
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func (p *parser) digits() int {
	start := p.pos
	for p.pos < len(p.text) && isDigit(p.text[p.pos]) {
		p.pos++
	}
	return p.pos - start
}

// number reads -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?. A fraction or an exponent
// without digits ends the number before it, and what follows is then extra data.
func (p *parser) number() (any, error) {
	start := p.pos
	if p.text[p.pos] == '-' {
		p.pos++
	}
	if p.pos < len(p.text) && p.text[p.pos] == '0' {
		p.pos++
	} else if p.digits() == 0 {
		return nil, p.errorf("expecting a value")
	}
	if p.pos+1 < len(p.text) && p.text[p.pos] == '.' && isDigit(p.text[p.pos+1]) {
		p.pos++
		p.digits()
	}
	if p.pos < len(p.text) && (p.text[p.pos] == 'e' || p.text[p.pos] == 'E') {
		mark := p.pos
		p.pos++
		if p.pos < len(p.text) && (p.text[p.pos] == '+' || p.text[p.pos] == '-') {
			p.pos++
		}
		if p.digits() == 0 {
			p.pos = mark
		}
	}
	return Number(p.text[start:p.pos]), nil
}

func (p *parser) string() (any, error) {
	p.pos++ // opening quote
	var out strings.Builder
	for {
		if p.pos >= len(p.text) {
			return nil, p.errorf("unterminated string")
		}
		c := p.text[p.pos]
		switch {
		case c == '"':
			p.pos++
			return out.String(), nil
		case c < 0x20:
			return nil, p.errorf("invalid control character in a string")
		case c != '\\':
			out.WriteByte(c)
			p.pos++
			continue
		}
		p.pos++ // backslash
		if p.pos >= len(p.text) {
			return nil, p.errorf("unterminated string")
		}
		escape := p.text[p.pos]
		p.pos++
		switch escape {
		case '"', '\\', '/':
			out.WriteByte(escape)
		case 'b':
			out.WriteByte('\b')
		case 'f':
			out.WriteByte('\f')
		case 'n':
			out.WriteByte('\n')
		case 'r':
			out.WriteByte('\r')
		case 't':
			out.WriteByte('\t')
		case 'u':
			unit, err := p.hex4()
			if err != nil {
				return nil, err
			}
			if utf16.IsSurrogate(rune(unit)) && unit < 0xdc00 && strings.HasPrefix(p.text[p.pos:], "\\u") {
				mark := p.pos
				p.pos += 2
				low, err := p.hex4()
				if err == nil && low >= 0xdc00 && low <= 0xdfff {
					out.WriteRune(utf16.DecodeRune(rune(unit), rune(low)))
					continue
				}
				p.pos = mark
			}
			writeCodeUnit(&out, unit)
		default:
			return nil, p.errorf("invalid escape")
		}
	}
}

func (p *parser) hex4() (uint16, error) {
	if p.pos+4 > len(p.text) {
		return 0, p.errorf("invalid \\uXXXX escape")
	}
	var unit uint16
	for _, c := range []byte(p.text[p.pos : p.pos+4]) {
		unit <<= 4
		switch {
		case c >= '0' && c <= '9':
			unit |= uint16(c - '0')
		case c >= 'a' && c <= 'f':
			unit |= uint16(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			unit |= uint16(c - 'A' + 10)
		default:
			return 0, p.errorf("invalid \\uXXXX escape")
		}
	}
	p.pos += 4
	return unit, nil
}

// writeCodeUnit writes one UTF-16 code unit; a lone surrogate goes in as its WTF-8 bytes.
func writeCodeUnit(out *strings.Builder, unit uint16) {
	if !utf16.IsSurrogate(rune(unit)) {
		out.WriteRune(rune(unit))
		return
	}
	out.WriteByte(byte(0xe0 | unit>>12))
	out.WriteByte(byte(0x80 | (unit>>6)&0x3f))
	out.WriteByte(byte(0x80 | unit&0x3f))
}
