package jcs_test

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"math"
	"strings"
	"testing"

	"github.com/agent-backplane/verifier/internal/vectors"
	"github.com/agent-backplane/verifier/jcs"
)

func canonical(t *testing.T, input []byte) []byte {
	t.Helper()
	value, err := jcs.Parse(input)
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	out, err := jcs.Canonical(value)
	if err != nil {
		t.Fatalf("canonical: %v", err)
	}
	return out
}

func TestItWritesEveryPublishedInputAsItsCanonicalOutput(t *testing.T) {
	for _, name := range []string{"arrays", "french", "structures", "unicode", "values", "weird", "rfc8785-sec3.2.2"} {
		t.Run(name, func(t *testing.T) {
			input := vectors.Read(t, "rfc8785/"+name+".input.json")
			want := vectors.Read(t, "rfc8785/"+name+".output.json")
			if got := canonical(t, input); !bytes.Equal(got, want) {
				t.Errorf("got  %s\nwant %s", got, want)
			}
		})
	}
}

func TestItSortsMembersByUTF16CodeUnits(t *testing.T) {
	value, err := jcs.Parse(canonical(t, vectors.Read(t, "rfc8785/rfc8785-sec3.2.3-sorting.input.json")))
	if err != nil {
		t.Fatal(err)
	}
	object := value.(*jcs.Object)
	expected, err := jcs.Parse(vectors.Read(t, "rfc8785/rfc8785-sec3.2.3-sorting.expected-values-order.json"))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, key := range object.Keys {
		got = append(got, object.Values[key].(string))
	}
	var want []string
	for _, item := range expected.([]any) {
		want = append(want, item.(string))
	}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("order %q, want %q", got, want)
	}
}

func double(t *testing.T, ieeeHex string) float64 {
	t.Helper()
	raw, err := hex.DecodeString(ieeeHex)
	if err != nil || len(raw) != 8 {
		t.Fatalf("bad ieee_hex %q", ieeeHex)
	}
	return math.Float64frombits(binary.BigEndian.Uint64(raw))
}

func TestItWritesNumbersAsECMAScriptDoes(t *testing.T) {
	file := vectors.Load(t, "rfc8785/numbers.json")
	rows := append(vectors.Objects(t, file, "rows"), vectors.Objects(t, file, "extra_samples")...)
	if len(rows) < 20 {
		t.Fatalf("only %d number vectors", len(rows))
	}
	for _, row := range rows {
		ieeeHex, _ := row.String("ieee_hex")
		value := double(t, ieeeHex)
		got, err := jcs.FormatDouble(value)
		expected, hasText := row.String("expected")
		if !hasText {
			if err == nil {
				t.Errorf("%s: %v must be refused, got %q", ieeeHex, value, got)
			}
			continue
		}
		if err != nil || got != expected {
			t.Errorf("%s: got %q (%v), want %q", ieeeHex, got, err, expected)
		}
		// The same text read back as JSON must canonicalise to itself.
		if again := canonical(t, []byte(expected)); string(again) != expected {
			t.Errorf("%s re-read: %q", expected, again)
		}
	}
}

func TestIntegersBeyondTwoToThe53AreTheDoubleTheyDenote(t *testing.T) {
	cases := map[string]string{
		"9007199254740991":             "9007199254740991",
		"-9007199254740991":            "-9007199254740991",
		"9007199254740993":             "9007199254740992", // ties to even
		"123456789012345678":           "123456789012345680",
		"1000000000000000000000":       "1e+21",
		"-0":                           "0",
		"-0.0":                         "0",
		"1.0":                          "1",
		"1E400":                        "",
		"1" + strings.Repeat("0", 400): "",
	}
	for input, want := range cases {
		value, err := jcs.Parse([]byte(input))
		if err != nil {
			t.Fatalf("%s: %v", input, err)
		}
		got, err := jcs.Canonical(value)
		if want == "" {
			if err == nil {
				t.Errorf("%s must be refused, got %s", input, got)
			}
			continue
		}
		if err != nil || string(got) != want {
			t.Errorf("%s: got %q (%v), want %q", input, got, err, want)
		}
	}
}

func TestItRefusesWhatHasNoCanonicalForm(t *testing.T) {
	for _, input := range []string{`NaN`, `[Infinity]`, `{"a": -Infinity}`, `"\ud800"`, `{"\udc00": 1}`} {
		value, err := jcs.Parse([]byte(input))
		if err != nil {
			t.Fatalf("%s is read (as the reference reader reads it): %v", input, err)
		}
		if out, err := jcs.Canonical(value); err == nil {
			t.Errorf("%s must be refused, got %s", input, out)
		}
	}
}

func TestItRefusesMalformedJSON(t *testing.T) {
	for _, input := range []string{``, ` `, `{`, `{"a" 1}`, `[1,]`, `01`, `1.`, `1e`, `"a` + "\n" + `"`, `{"a":1}x`, "\xff", `tru`} {
		if _, err := jcs.Parse([]byte(input)); err == nil {
			t.Errorf("%q must be refused", input)
		}
	}
}

func TestBytesAreDecodedAsTheReferenceReaderDecodesThem(t *testing.T) {
	want := `{"a":"é"}`
	utf16le := []byte{0xff, 0xfe}
	for _, r := range want {
		utf16le = append(utf16le, byte(r), byte(r>>8))
	}
	for name, data := range map[string][]byte{
		"UTF-8":                []byte(want),
		"UTF-8 with a BOM":     append([]byte{0xef, 0xbb, 0xbf}, want...),
		"UTF-16 with a BOM":    utf16le,
		"UTF-16BE, no BOM":     {0, '{', 0, '}'},
		"an encoded surrogate": []byte("\"\xed\xa0\x80\""),
	} {
		value, err := jcs.ParseBytes(data)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		out, err := jcs.Canonical(value)
		switch name {
		case "an encoded surrogate":
			if err == nil {
				t.Errorf("%s must not canonicalise: %s", name, out)
			}
		case "UTF-16BE, no BOM":
			if string(out) != "{}" {
				t.Errorf("%s: %s", name, out)
			}
		default:
			if string(out) != want {
				t.Errorf("%s: %s (%v)", name, out, err)
			}
		}
	}
	if _, err := jcs.ParseBytes([]byte("\"\xff\"")); err == nil {
		t.Error("a byte that is not UTF-8 must be refused")
	}
}
