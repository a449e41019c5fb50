package jcs

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// ParseBytes reads one JSON text from bytes as the reference reader does (Python's json.loads
// on bytes): the encoding is detected (a UTF-8 byte order mark is skipped, UTF-16 and UTF-32 are
// recognised by their marks or their zero bytes), and encoded lone surrogates are let through,
// to be refused by canonicalisation. An event line so written is read, not refused: its hash is
// recomputed from the content all the same.
func ParseBytes(data []byte) (any, error) {
	text, err := decode(data)
	if err != nil {
		return nil, err
	}
	return parseText(text)
}

var (
	bomUTF8    = []byte{0xef, 0xbb, 0xbf}
	bomUTF16BE = []byte{0xfe, 0xff}
	bomUTF16LE = []byte{0xff, 0xfe}
	bomUTF32BE = []byte{0x00, 0x00, 0xfe, 0xff}
	bomUTF32LE = []byte{0xff, 0xfe, 0x00, 0x00}
)

// decode returns the text as UTF-8, lone surrogates as WTF-8.
func decode(data []byte) (string, error) {
	switch {
	case bytes.HasPrefix(data, bomUTF32BE):
		return decodeUnits(data[4:], 4, binary.BigEndian)
	case bytes.HasPrefix(data, bomUTF32LE):
		return decodeUnits(data[4:], 4, binary.LittleEndian)
	case bytes.HasPrefix(data, bomUTF16BE):
		return decodeUnits(data[2:], 2, binary.BigEndian)
	case bytes.HasPrefix(data, bomUTF16LE):
		return decodeUnits(data[2:], 2, binary.LittleEndian)
	case bytes.HasPrefix(data, bomUTF8):
		return decodeUTF8(data[3:])
	case len(data) >= 4 && data[0] == 0 && data[1] != 0:
		return decodeUnits(data, 2, binary.BigEndian)
	case len(data) >= 4 && data[0] == 0:
		return decodeUnits(data, 4, binary.BigEndian)
	case len(data) >= 4 && data[1] == 0 && (data[2] != 0 || data[3] != 0):
		return decodeUnits(data, 2, binary.LittleEndian)
	case len(data) >= 4 && data[1] == 0:
		return decodeUnits(data, 4, binary.LittleEndian)
	case len(data) == 2 && data[0] == 0:
		return decodeUnits(data, 2, binary.BigEndian)
	case len(data) == 2 && data[1] == 0:
		return decodeUnits(data, 2, binary.LittleEndian)
	}
	return decodeUTF8(data)
}

// decodeUTF8 accepts UTF-8 and, besides, the three-byte forms of surrogates.
func decodeUTF8(data []byte) (string, error) {
	for i := 0; i < len(data); {
		r, width := utf8.DecodeRune(data[i:])
		if r == utf8.RuneError && width <= 1 {
			if i+2 < len(data) && data[i] == 0xed && data[i+1]&0xe0 == 0xa0 && data[i+2]&0xc0 == 0x80 {
				i += 3
				continue
			}
			return "", fmt.Errorf("not UTF-8: byte 0x%02x at %d", data[i], i)
		}
		i += width
	}
	return string(data), nil
}

func decodeUnits(data []byte, size int, order binary.ByteOrder) (string, error) {
	if len(data)%size != 0 {
		return "", fmt.Errorf("truncated UTF-%d data", 8*size)
	}
	var out strings.Builder
	for i := 0; i < len(data); i += size {
		if size == 4 {
			r := rune(order.Uint32(data[i:]))
			if r > utf8.MaxRune {
				return "", fmt.Errorf("code point out of range in UTF-32 data")
			}
			if utf16.IsSurrogate(r) {
				writeCodeUnit(&out, uint16(r))
			} else {
				out.WriteRune(r)
			}
			continue
		}
		unit := order.Uint16(data[i:])
		if unit >= 0xd800 && unit < 0xdc00 && i+3 < len(data) {
			if low := order.Uint16(data[i+2:]); low >= 0xdc00 && low <= 0xdfff {
				out.WriteRune(utf16.DecodeRune(rune(unit), rune(low)))
				i += 2
				continue
			}
		}
		writeCodeUnit(&out, unit)
	}
	return out.String(), nil
}
