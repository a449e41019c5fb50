// Package vectors reads the repository's shared test vectors (vectors/ beside verifier/), the
// files every implementation of the contract is held to.
package vectors

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/agent-backplane/verifier/jcs"
)

// Dir is the repository's vectors/ folder.
func Dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "vectors")
}

// Read returns a vector file's bytes; a missing file fails the test.
func Read(t testing.TB, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(Dir(), name))
	if err != nil {
		t.Fatalf("the shared vectors must be there: %v", err)
	}
	return data
}

// Load parses a vector file with the verifier's own JSON reader.
func Load(t testing.TB, name string) *jcs.Object {
	t.Helper()
	value, err := jcs.Parse(Read(t, name))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	object, ok := value.(*jcs.Object)
	if !ok {
		t.Fatalf("%s is not a JSON object", name)
	}
	return object
}

// Objects is a member that is a list of objects.
func Objects(t testing.TB, object *jcs.Object, name string) []*jcs.Object {
	t.Helper()
	items, ok := object.Value(name).([]any)
	if !ok {
		t.Fatalf("%s is not a list", name)
	}
	out := make([]*jcs.Object, len(items))
	for i, item := range items {
		if out[i], ok = item.(*jcs.Object); !ok {
			t.Fatalf("%s[%d] is not an object", name, i)
		}
	}
	return out
}

// Strings is a member that is a list of strings (null reads as an empty list).
func Strings(t testing.TB, object *jcs.Object, name string) []string {
	t.Helper()
	if object.Value(name) == nil {
		return nil
	}
	items, ok := object.Value(name).([]any)
	if !ok {
		t.Fatalf("%s is not a list", name)
	}
	out := make([]string, len(items))
	for i, item := range items {
		if out[i], ok = item.(string); !ok {
			t.Fatalf("%s[%d] is not a string", name, i)
		}
	}
	return out
}

// Uint is a member that is a non-negative integer.
func Uint(t testing.TB, object *jcs.Object, name string) uint64 {
	t.Helper()
	number, ok := object.Value(name).(jcs.Number)
	if ok {
		if integer, isInteger := number.Integer(); isInteger && integer.IsUint64() {
			return integer.Uint64()
		}
	}
	t.Fatalf("%s is not a count: %v", name, object.Value(name))
	return 0
}
