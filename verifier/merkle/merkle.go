// Package merkle is the RFC 6962 / RFC 9162 §2.1 Merkle tree the export is sealed with: leaf
// hash SHA-256(0x00 ‖ data), node hash SHA-256(0x01 ‖ left ‖ right), the empty tree's root
// SHA-256(""), and the verification of inclusion and consistency proofs.
package merkle

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
)

// Size of every hash in the tree.
const Size = sha256.Size

// EmptyRoot is the root of the tree of no leaves.
var EmptyRoot = sha256.Sum256(nil)

// LeafHash hashes a leaf's data.
func LeafHash(data []byte) []byte {
	digest := sha256.Sum256(append([]byte{0x00}, data...))
	return digest[:]
}

// NodeHash hashes two children.
func NodeHash(left, right []byte) []byte {
	h := sha256.New()
	h.Write([]byte{0x01})
	h.Write(left)
	h.Write(right)
	return h.Sum(nil)
}

// EventLeafHash is an event's leaf: its hash, the 64 hex digits taken as 32 raw bytes.
func EventLeafHash(eventHashHex string) ([]byte, error) {
	raw, err := HashFromHex(eventHashHex)
	if err != nil {
		return nil, err
	}
	return LeafHash(raw), nil
}

// HashFromHex reads exactly 64 lowercase hex digits, the only spelling the export uses.
func HashFromHex(text string) ([]byte, error) {
	if len(text) != 2*Size || !isLowerHex(text) {
		return nil, fmt.Errorf("expected %d lowercase hex digits, got %q", 2*Size, text)
	}
	return hex.DecodeString(text)
}

func isLowerHex(text string) bool {
	for i := 0; i < len(text); i++ {
		c := text[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// Frontier is a growing tree reduced to the roots of its perfect subtrees, largest first: one
// per set bit of the size, so appending never re-reads old leaves.
type Frontier struct {
	size  uint64
	peaks [][]byte
}

// Size is the number of leaves appended.
func (f *Frontier) Size() uint64 { return f.size }

// Append adds a leaf hash.
func (f *Frontier) Append(leaf []byte) {
	f.peaks = append(f.peaks, leaf)
	// Each trailing 1 bit of the old size is a perfect subtree that the new leaf completes a
	// sibling for: merge them, smallest first.
	for size := f.size; size&1 == 1; size >>= 1 {
		last := len(f.peaks) - 1
		f.peaks = append(f.peaks[:last-1], NodeHash(f.peaks[last-1], f.peaks[last]))
	}
	f.size++
}

// Root is MTH of all the leaves appended: the peaks folded from the right.
func (f *Frontier) Root() []byte {
	if len(f.peaks) == 0 {
		return EmptyRoot[:]
	}
	root := f.peaks[len(f.peaks)-1]
	for i := len(f.peaks) - 2; i >= 0; i-- {
		root = NodeHash(f.peaks[i], root)
	}
	return root
}

// RootOf is MTH(D[0:n]) for a list of leaf hashes (RFC 6962 §2.1).
func RootOf(leaves [][]byte) []byte {
	var f Frontier
	for _, leaf := range leaves {
		f.Append(leaf)
	}
	return f.Root()
}

func allHashes(hashes ...[]byte) bool {
	for _, h := range hashes {
		if len(h) != Size {
			return false
		}
	}
	return true
}

// VerifyInclusion checks an audit path (RFC 9162 §2.1.3.2) from leaf `index` of a tree of
// `size` leaves to `root`.
func VerifyInclusion(leaf []byte, index, size uint64, path [][]byte, root []byte) bool {
	if index >= size || !allHashes(leaf, root) || !allHashes(path...) {
		return false
	}
	fn, sn := index, size-1
	r := leaf
	for _, p := range path {
		if sn == 0 {
			return false
		}
		if fn&1 == 1 || fn == sn {
			r = NodeHash(p, r)
			for fn&1 == 0 && fn != 0 {
				fn >>= 1
				sn >>= 1
			}
		} else {
			r = NodeHash(r, p)
		}
		fn >>= 1
		sn >>= 1
	}
	return sn == 0 && bytes.Equal(r, root)
}

// VerifyConsistency checks that the tree of `second` leaves with root `secondRoot` extends the
// tree of `first` leaves with root `firstRoot` (RFC 9162 §2.1.4.2). A proof from the empty tree
// is refused: there is nothing to be consistent with, and no proof could say otherwise.
func VerifyConsistency(first, second uint64, firstRoot, secondRoot []byte, proof [][]byte) bool {
	switch {
	case first == 0 || first > second:
		return false
	case first == second:
		// The same tree: nothing to prove, and the roots are compared as given.
		return len(proof) == 0 && bytes.Equal(firstRoot, secondRoot)
	case len(proof) == 0 || !allHashes(firstRoot, secondRoot) || !allHashes(proof...):
		return false
	}
	// 1. When the first tree is perfect, its root is the first node of the path.
	path := proof
	if first&(first-1) == 0 {
		path = append([][]byte{firstRoot}, proof...)
	}
	fn, sn := first-1, second-1
	for fn&1 == 1 {
		fn >>= 1
		sn >>= 1
	}
	fr, sr := path[0], path[0]
	for _, c := range path[1:] {
		if sn == 0 {
			return false
		}
		if fn&1 == 1 || fn == sn {
			fr = NodeHash(c, fr)
			sr = NodeHash(c, sr)
			for fn&1 == 0 && fn != 0 {
				fn >>= 1
				sn >>= 1
			}
		} else {
			sr = NodeHash(sr, c)
		}
		fn >>= 1
		sn >>= 1
	}
	return sn == 0 && bytes.Equal(fr, firstRoot) && bytes.Equal(sr, secondRoot)
}
