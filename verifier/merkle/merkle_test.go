package merkle_test

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"testing"

	"github.com/agent-backplane/verifier/internal/vectors"
	"github.com/agent-backplane/verifier/jcs"
	"github.com/agent-backplane/verifier/merkle"
)

func unhex(t *testing.T, text string) []byte {
	t.Helper()
	raw, err := hex.DecodeString(text)
	if err != nil {
		t.Fatalf("bad hex %q", text)
	}
	return raw
}

func unhexAll(t *testing.T, texts []string) [][]byte {
	out := make([][]byte, len(texts))
	for i, text := range texts {
		out[i] = unhex(t, text)
	}
	return out
}

func field(t *testing.T, object *jcs.Object, name string) string {
	t.Helper()
	text, ok := object.String(name)
	if !ok {
		t.Fatalf("%s is not a string", name)
	}
	return text
}

// flipped is a copy with one bit changed.
func flipped(hash []byte) []byte {
	out := append([]byte(nil), hash...)
	out[0] ^= 1
	return out
}

func TestThePublishedTreesHashAndVerify(t *testing.T) {
	file := vectors.Load(t, "rfc6962.json")
	leaves := unhexAll(t, vectors.Strings(t, file, "leaves_hex"))
	want := vectors.Strings(t, file, "leaf_hashes")
	var hashes [][]byte
	for i, leaf := range leaves {
		hashes = append(hashes, merkle.LeafHash(leaf))
		if got := hex.EncodeToString(hashes[i]); got != want[i] {
			t.Errorf("leaf %d: %s, want %s", i, got, want[i])
		}
	}
	roots, _ := file.Object("roots")
	for size := 0; size <= len(hashes); size++ {
		if got := hex.EncodeToString(merkle.RootOf(hashes[:size])); got != field(t, roots, fmt.Sprint(size)) {
			t.Errorf("root of %d: %s", size, got)
		}
	}
	levels, _ := file.Object("node_hashes_by_level")
	for level, row := range levels.Value("levels").([]any) {
		for i, node := range row.([]any) {
			start := i << level
			if got := hex.EncodeToString(merkle.RootOf(hashes[start : start+1<<level])); got != node {
				t.Errorf("level %d node %d: %s, want %s", level, i, got, node)
			}
		}
	}
	for _, vector := range vectors.Objects(t, file, "inclusion") {
		index, size := vectors.Uint(t, vector, "leaf_index"), vectors.Uint(t, vector, "tree_size")
		leaf, root := unhex(t, field(t, vector, "leaf_hash")), unhex(t, field(t, vector, "root"))
		path := unhexAll(t, vectors.Strings(t, vector, "path"))
		if !merkle.VerifyInclusion(leaf, index, size, path, root) {
			t.Errorf("inclusion of %d in %d does not verify", index, size)
		}
		if merkle.VerifyInclusion(flipped(leaf), index, size, path, root) {
			t.Errorf("inclusion of a changed leaf %d in %d verifies", index, size)
		}
	}
	for _, vector := range vectors.Objects(t, file, "consistency") {
		first, second := vectors.Uint(t, vector, "first"), vectors.Uint(t, vector, "second")
		firstRoot, secondRoot := unhex(t, field(t, vector, "first_root")), unhex(t, field(t, vector, "second_root"))
		proof := unhexAll(t, vectors.Strings(t, vector, "proof"))
		if !merkle.VerifyConsistency(first, second, firstRoot, secondRoot, proof) {
			t.Errorf("consistency %d -> %d does not verify", first, second)
		}
		if merkle.VerifyConsistency(first, second, flipped(firstRoot), secondRoot, proof) {
			t.Errorf("consistency %d -> %d verifies from another root", first, second)
		}
	}
	for _, vector := range vectors.Objects(t, file, "hasher") {
		var got []byte
		switch field(t, vector, "kind") {
		case "empty_tree":
			got = merkle.EmptyRoot[:]
		case "leaf":
			got = merkle.LeafHash(unhex(t, field(t, vector, "data_hex")))
		case "node":
			got = merkle.NodeHash(unhex(t, field(t, vector, "left_hex")), unhex(t, field(t, vector, "right_hex")))
		default:
			t.Fatalf("unknown hasher vector %v", vector.Value("kind"))
		}
		if hex.EncodeToString(got) != field(t, vector, "expected") {
			t.Errorf("hasher %v: %x", vector.Value("kind"), got)
		}
	}
	ct, _ := file.Object("ct_log_inclusion")
	leaf := merkle.LeafHash(unhex(t, field(t, ct, "leaf_input_hex")))
	if hex.EncodeToString(leaf) != field(t, ct, "leaf_hash") {
		t.Errorf("CT leaf hash %x", leaf)
	}
	if !merkle.VerifyInclusion(leaf, vectors.Uint(t, ct, "leaf_index"), vectors.Uint(t, ct, "tree_size"),
		unhexAll(t, vectors.Strings(t, ct, "path")), unhex(t, field(t, ct, "root"))) {
		t.Error("the CT log's inclusion proof does not verify")
	}
}

func TestEveryPublishedProbeIsAcceptedOrRejectedAsIt(t *testing.T) {
	file := vectors.Load(t, "rfc6962_probes.json")
	inclusion, consistency := vectors.Objects(t, file, "inclusion"), vectors.Objects(t, file, "consistency")
	if len(inclusion) == 0 || len(consistency) == 0 {
		t.Fatal("no probes")
	}
	for _, probe := range inclusion {
		ok := merkle.VerifyInclusion(unhex(t, field(t, probe, "leafHash")), vectors.Uint(t, probe, "leafIdx"),
			vectors.Uint(t, probe, "treeSize"), unhexAll(t, vectors.Strings(t, probe, "proof")),
			unhex(t, field(t, probe, "root")))
		if ok == (probe.Value("wantErr") == true) {
			t.Errorf("%s (%s): verified %v", field(t, probe, "file"), field(t, probe, "desc"), ok)
		}
	}
	for _, probe := range consistency {
		ok := merkle.VerifyConsistency(vectors.Uint(t, probe, "size1"), vectors.Uint(t, probe, "size2"),
			unhex(t, field(t, probe, "root1")), unhex(t, field(t, probe, "root2")),
			unhexAll(t, vectors.Strings(t, probe, "proof")))
		if ok == (probe.Value("wantErr") == true) {
			t.Errorf("%s (%s): verified %v", field(t, probe, "file"), field(t, probe, "desc"), ok)
		}
	}
}

func TestTheProductsOwnTreeHashesAndVerifies(t *testing.T) {
	file := vectors.Load(t, "merkle.json")
	eventHashes, wantLeaves := vectors.Strings(t, file, "event_hashes"), vectors.Strings(t, file, "leaf_hashes")
	var leaves [][]byte
	for i, eventHash := range eventHashes {
		leaf, err := merkle.EventLeafHash(eventHash)
		if err != nil {
			t.Fatal(err)
		}
		if hex.EncodeToString(leaf) != wantLeaves[i] {
			t.Errorf("leaf %d: %x, want %s", i, leaf, wantLeaves[i])
		}
		leaves = append(leaves, leaf)
	}
	roots, _ := file.Object("roots")
	rootOf := func(size uint64) []byte { return unhex(t, field(t, roots, fmt.Sprint(size))) }
	var frontier merkle.Frontier
	for size := 0; size <= len(leaves); size++ {
		if !bytes.Equal(frontier.Root(), rootOf(uint64(size))) {
			t.Errorf("root of %d: %x", size, frontier.Root())
		}
		if size < len(leaves) {
			frontier.Append(leaves[size])
		}
	}
	inclusion := vectors.Objects(t, file, "inclusion")
	for _, vector := range inclusion {
		index, size := vectors.Uint(t, vector, "leaf_index"), vectors.Uint(t, vector, "tree_size")
		path := unhexAll(t, vectors.Strings(t, vector, "path"))
		if !merkle.VerifyInclusion(leaves[index], index, size, path, rootOf(size)) {
			t.Errorf("inclusion of %d in %d does not verify", index, size)
		}
		other := leaves[(index+1)%uint64(len(leaves))]
		if size > 1 && merkle.VerifyInclusion(other, index, size, path, rootOf(size)) {
			t.Errorf("another leaf verifies at %d in %d", index, size)
		}
	}
	consistency := vectors.Objects(t, file, "consistency")
	for _, vector := range consistency {
		first, second := vectors.Uint(t, vector, "first"), vectors.Uint(t, vector, "second")
		proof := unhexAll(t, vectors.Strings(t, vector, "proof"))
		if !merkle.VerifyConsistency(first, second, rootOf(first), rootOf(second), proof) {
			t.Errorf("consistency %d -> %d does not verify", first, second)
		}
		if first < second && merkle.VerifyConsistency(first, second, rootOf(second), rootOf(second), proof) {
			t.Errorf("consistency %d -> %d verifies from the wrong root", first, second)
		}
	}
	if len(inclusion) != 66 || len(consistency) != 66 {
		t.Errorf("%d inclusion and %d consistency vectors: every pair of an 11-leaf tree is 66", len(inclusion),
			len(consistency))
	}
}
