"""RFC 6962 / RFC 9162 Merkle trees against the published vectors and probes, plus properties.

``vectors/rfc6962.json`` and ``rfc6962_probes.json`` are vendored copies of the
transparency-dev/merkle and certificate-transparency vectors (see vectors/README.md).
"""

from __future__ import annotations

import ast
import hashlib
import json
import random
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from backplane.integrity import merkle
from backplane.integrity.merkle import (
    EMPTY_ROOT,
    CompactRange,
    MerkleTree,
    consistency_proof,
    event_leaf_hash,
    hash_from_hex,
    inclusion_proof,
    leaf_hash,
    node_hash,
    root_from_leaf_hashes,
    verify_consistency,
    verify_inclusion,
)

VECTORS_DIR = Path(__file__).resolve().parents[3] / "vectors"
VECTORS = json.loads((VECTORS_DIR / "rfc6962.json").read_text())
PROBES = json.loads((VECTORS_DIR / "rfc6962_probes.json").read_text())

LEAVES = [bytes.fromhex(x) for x in VECTORS["leaves_hex"]]
LEAF_HASHES = [bytes.fromhex(x) for x in VECTORS["leaf_hashes"]]


def h(text: str) -> bytes:
    return bytes.fromhex(text)


def hs(items: Sequence[str] | None) -> list[bytes]:
    return [bytes.fromhex(x) for x in items or []]


def flip(value: bytes, bit: int = 0) -> bytes:
    out = bytearray(value)
    out[bit // 8 % len(out)] ^= 1 << (bit % 8)
    return bytes(out)


def random_leaves(rng: random.Random, n: int) -> list[bytes]:
    return [leaf_hash(rng.randbytes(rng.randrange(0, 40))) for _ in range(n)]


# --- a literal transcription of RFC 6962 §2.1 (recursive, slicing), as the reference ---


def _k(n: int) -> int:
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def ref_mth(d: list[bytes]) -> bytes:
    n = len(d)
    if n == 0:
        return hashlib.sha256(b"").digest()
    if n == 1:
        return d[0]
    k = _k(n)
    return node_hash(ref_mth(d[:k]), ref_mth(d[k:]))


def ref_path(m: int, d: list[bytes]) -> list[bytes]:
    n = len(d)
    if n == 1:
        return []
    k = _k(n)
    if m < k:
        return ref_path(m, d[:k]) + [ref_mth(d[k:])]
    return ref_path(m - k, d[k:]) + [ref_mth(d[:k])]


def ref_subproof(m: int, d: list[bytes], b: bool) -> list[bytes]:
    n = len(d)
    if m == n:
        return [] if b else [ref_mth(d)]
    k = _k(n)
    if m <= k:
        return ref_subproof(m, d[:k], b) + [ref_mth(d[k:])]
    return ref_subproof(m - k, d[k:], False) + [ref_mth(d[:k])]


def ref_proof(m: int, d: list[bytes]) -> list[bytes]:
    return ref_subproof(m, d, True)


# --- published vectors -------------------------------------------------------------------


@pytest.mark.parametrize("vector", VECTORS["hasher"], ids=lambda v: f"{v['kind']}-{v['expected'][:8]}")
def test_hasher_vectors(vector: dict) -> None:
    expected = h(vector["expected"])
    if vector["kind"] == "empty_tree":
        assert EMPTY_ROOT == expected
        assert root_from_leaf_hashes([]) == expected
    elif vector["kind"] == "leaf":
        assert leaf_hash(h(vector["data_hex"])) == expected
    else:
        assert vector["kind"] == "node"
        assert node_hash(h(vector["left_hex"]), h(vector["right_hex"])) == expected


def test_leaf_hashes_of_the_standard_inputs() -> None:
    assert [leaf_hash(x) for x in LEAVES] == LEAF_HASHES


def test_complete_subtree_hashes_by_level() -> None:
    levels = VECTORS["node_hashes_by_level"]["levels"]
    for height, row in enumerate(levels):
        width = 1 << height
        for i, expected in enumerate(row):
            assert root_from_leaf_hashes(LEAF_HASHES[i * width : (i + 1) * width]) == h(expected)
    tree = MerkleTree(LEAF_HASHES)
    assert [[x.hex() for x in level] for level in tree._levels] == levels


@pytest.mark.parametrize("n", range(9))
def test_roots_of_the_first_n_leaves(n: int) -> None:
    expected = h(VECTORS["roots"][str(n)])
    assert root_from_leaf_hashes(LEAF_HASHES[:n]) == expected
    assert MerkleTree(LEAF_HASHES).root(n) == expected
    assert MerkleTree(LEAF_HASHES[:n]).root() == expected
    compact = CompactRange()
    compact.extend(LEAF_HASHES[:n])
    assert compact.root() == expected
    assert ref_mth(LEAF_HASHES[:n]) == expected


@pytest.mark.parametrize("vector", VECTORS["inclusion"], ids=lambda v: f"{v['leaf_index']}-of-{v['tree_size']}")
def test_inclusion_vectors(vector: dict) -> None:
    index, size = vector["leaf_index"], vector["tree_size"]
    leaf = h(vector["leaf_hash"])
    assert leaf_hash(h(vector["leaf_hex"])) == leaf == LEAF_HASHES[index]
    assert root_from_leaf_hashes(LEAF_HASHES[:size]) == h(vector["root"])
    assert inclusion_proof(LEAF_HASHES, index, size) == hs(vector["path"])
    assert verify_inclusion(leaf, index, size, hs(vector["path"]), h(vector["root"]))


@pytest.mark.parametrize("vector", VECTORS["consistency"], ids=lambda v: f"{v['first']}-to-{v['second']}")
def test_consistency_vectors(vector: dict) -> None:
    first, second = vector["first"], vector["second"]
    assert root_from_leaf_hashes(LEAF_HASHES[:first]) == h(vector["first_root"])
    assert root_from_leaf_hashes(LEAF_HASHES[:second]) == h(vector["second_root"])
    assert consistency_proof(LEAF_HASHES, first, second) == hs(vector["proof"])
    assert verify_consistency(first, second, h(vector["first_root"]), h(vector["second_root"]), hs(vector["proof"]))


def test_the_ct_log_inclusion_proof() -> None:
    vector = VECTORS["ct_log_inclusion"]
    leaf = leaf_hash(h(vector["leaf_input_hex"]))
    assert leaf == h(vector["leaf_hash"])
    index, size, path, root = vector["leaf_index"], vector["tree_size"], hs(vector["path"]), h(vector["root"])
    assert verify_inclusion(leaf, index, size, path, root)
    assert not verify_inclusion(leaf, index + 1, size, path, root)
    # (A neighbouring size can share this proof's shape; double the size changes its length.)
    assert not verify_inclusion(leaf, index, size * 2, path, root)
    assert not verify_inclusion(leaf, index, size, path[:-1], root)
    assert not verify_inclusion(flip(leaf), index, size, path, root)
    assert not verify_inclusion(leaf, index, size, path, flip(root))
    for i in range(len(path)):
        assert not verify_inclusion(leaf, index, size, path[:i] + [flip(path[i], 77)] + path[i + 1 :], root)


# --- published probes (transparency-dev/merkle testdata) ---------------------------------


@pytest.mark.parametrize("probe", PROBES["inclusion"], ids=lambda p: p["file"].removeprefix("testdata/inclusion/"))
def test_inclusion_probes(probe: dict) -> None:
    accepted = verify_inclusion(
        h(probe["leafHash"]), probe["leafIdx"], probe["treeSize"], hs(probe["proof"]), h(probe["root"])
    )
    assert accepted is (not probe["wantErr"])
    if probe["file"].endswith("happy-path.json"):
        assert inclusion_proof(LEAF_HASHES, probe["leafIdx"], probe["treeSize"]) == hs(probe["proof"])


@pytest.mark.parametrize("probe", PROBES["consistency"], ids=lambda p: p["file"].removeprefix("testdata/consistency/"))
def test_consistency_probes(probe: dict) -> None:
    accepted = verify_consistency(
        probe["size1"], probe["size2"], h(probe["root1"]), h(probe["root2"]), hs(probe["proof"])
    )
    assert accepted is (not probe["wantErr"])
    if probe["file"].endswith("happy-path.json"):
        assert consistency_proof(LEAF_HASHES, probe["size1"], probe["size2"]) == hs(probe["proof"])


def test_the_probes_cover_both_outcomes() -> None:
    for kind in ("inclusion", "consistency"):
        outcomes = {p["wantErr"] for p in PROBES[kind]}
        assert outcomes == {True, False}
    assert len(PROBES["inclusion"]) == 98 and len(PROBES["consistency"]) == 98


# --- malformed input ---------------------------------------------------------------------


def test_verify_inclusion_rejects_malformed_input() -> None:
    tree = MerkleTree(LEAF_HASHES)
    leaf, proof, root = LEAF_HASHES[5], tree.inclusion_proof(5, 8), tree.root(8)
    assert verify_inclusion(leaf, 5, 8, proof, root)
    assert verify_inclusion(leaf, 5, 8, tuple(proof), root)
    assert not verify_inclusion(leaf, 8, 8, proof, root)  # index == size
    assert not verify_inclusion(leaf, -3, 8, proof, root)
    assert not verify_inclusion(leaf, 5, 0, [], EMPTY_ROOT)
    assert not verify_inclusion(leaf, True, 8, proof, root)  # a bool is not an index
    assert not verify_inclusion(leaf, 5.0, 8, proof, root)  # type: ignore[arg-type]
    assert not verify_inclusion(leaf[:31], 5, 8, proof, root)
    assert not verify_inclusion(leaf + b"\x00", 5, 8, proof, root)
    assert not verify_inclusion(leaf.hex(), 5, 8, proof, root)  # type: ignore[arg-type]
    assert not verify_inclusion(leaf, 5, 8, proof, root[:31])
    assert not verify_inclusion(leaf, 5, 8, [*proof[:2], proof[2] + b"\x00"], root)
    assert not verify_inclusion(leaf, 5, 8, [b"", *proof], root)
    assert not verify_inclusion(leaf, 5, 8, [*proof, b""], root)
    assert not verify_inclusion(leaf, 5, 8, [*proof, root], root)
    assert not verify_inclusion(leaf, 5, 8, None, root)  # type: ignore[arg-type]
    run_together: Any = b"".join(proof)  # deliberately ill-typed: bytes, not a sequence of hashes
    assert not verify_inclusion(leaf, 5, 8, run_together, root)
    # A 2**64 - 1 index (Go's uint64 wrap-around in the probes) is just out of range.
    assert not verify_inclusion(leaf, 2**64 - 1, 8, proof, root)


def test_verify_consistency_rejects_malformed_input() -> None:
    tree = MerkleTree(LEAF_HASHES)
    r3, r8, proof = tree.root(3), tree.root(8), tree.consistency_proof(3, 8)
    assert verify_consistency(3, 8, r3, r8, proof)
    assert not verify_consistency(8, 3, r8, r3, proof)
    assert not verify_consistency(0, 0, EMPTY_ROOT, EMPTY_ROOT, [])  # from the empty tree: meaningless
    assert not verify_consistency(0, 8, EMPTY_ROOT, r8, [])
    assert not verify_consistency(-1, 8, r3, r8, proof)
    assert not verify_consistency(True, 8, r3, r8, proof)
    assert not verify_consistency(3, 8, r3, r8, [])
    assert not verify_consistency(3, 8, r3, r8, proof[:-1])
    assert not verify_consistency(3, 8, r3, r8, [*proof, r8])
    assert not verify_consistency(3, 8, r3, r8, [r3, *proof])
    assert not verify_consistency(3, 8, r3[:31], r8, proof)
    assert not verify_consistency(3, 8, r3, r8 + b"\x00", proof)
    assert not verify_consistency(3, 8, r3, r8, [*proof[:-1], proof[-1][:31]])
    assert not verify_consistency(3, 8, r3, r8, None)  # type: ignore[arg-type]
    assert not verify_consistency(3, 8, r3.hex(), r8.hex(), proof)  # type: ignore[arg-type]
    # Equal sizes: the proof must be empty and the roots equal.
    assert verify_consistency(8, 8, r8, r8, [])
    assert not verify_consistency(8, 8, r8, r8, [r8])
    assert not verify_consistency(8, 8, r8, r3, [])


def test_proof_builders_reject_impossible_requests() -> None:
    with pytest.raises(ValueError):
        inclusion_proof(LEAF_HASHES, 8, 8)
    with pytest.raises(ValueError):
        inclusion_proof(LEAF_HASHES, 0, 9)
    with pytest.raises(ValueError):
        inclusion_proof(LEAF_HASHES, -1, 8)
    with pytest.raises(ValueError):
        inclusion_proof(LEAF_HASHES, 0, 0)
    with pytest.raises(ValueError):
        consistency_proof(LEAF_HASHES, 0, 8)
    with pytest.raises(ValueError):
        consistency_proof(LEAF_HASHES, 0, 0)
    with pytest.raises(ValueError):
        consistency_proof(LEAF_HASHES, 5, 4)
    with pytest.raises(ValueError):
        consistency_proof(LEAF_HASHES, 4, 9)
    assert consistency_proof(LEAF_HASHES, 4, 4) == []
    with pytest.raises(ValueError):
        root_from_leaf_hashes([b"short"])
    with pytest.raises(TypeError):
        root_from_leaf_hashes(["ab" * 32])  # type: ignore[list-item]
    with pytest.raises(ValueError):
        MerkleTree([LEAF_HASHES[0], LEAF_HASHES[1] + b"\x00"])


def test_event_leaf_hash_uses_the_32_raw_bytes_of_the_event_hash() -> None:
    event_hash = hashlib.sha256(b"some canonical event").hexdigest()
    assert event_leaf_hash(event_hash) == hashlib.sha256(b"\x00" + bytes.fromhex(event_hash)).digest()
    assert event_leaf_hash(event_hash) != leaf_hash(event_hash.encode())
    for bad in (event_hash.upper(), event_hash[:-2], event_hash + "00", " " + event_hash[1:], "g" * 64, b"\x00" * 32):
        with pytest.raises(ValueError):
            event_leaf_hash(bad)  # type: ignore[arg-type]


def test_hash_from_hex_round_trip() -> None:
    assert hash_from_hex(EMPTY_ROOT.hex()) == EMPTY_ROOT
    assert merkle.hashes_to_hex(LEAF_HASHES) == VECTORS["leaf_hashes"]


# --- properties on random trees ---------------------------------------------------------

PROPERTY_SIZES = [*range(1, 34), 63, 64, 65, 100, 127, 128, 129, 200, 255, 256, 257, 300]


@pytest.mark.parametrize("n", PROPERTY_SIZES)
def test_every_inclusion_proof_verifies_and_any_tampering_fails(n: int) -> None:
    rng = random.Random(n)
    leaves = random_leaves(rng, n)
    tree = MerkleTree(leaves)
    root = tree.root()
    assert root == root_from_leaf_hashes(leaves) == ref_mth(leaves)
    for index in range(n):
        proof = tree.inclusion_proof(index, n)
        if n <= 33:
            assert proof == ref_path(index, leaves)
        assert len(proof) == merkle._inclusion_proof_length(index, n)
        leaf = leaves[index]
        assert verify_inclusion(leaf, index, n, proof, root)
        for i in range(len(proof)):
            assert not verify_inclusion(
                leaf, index, n, [*proof[:i], flip(proof[i], rng.randrange(256)), *proof[i + 1 :]], root
            )
        assert not verify_inclusion(flip(leaf, rng.randrange(256)), index, n, proof, root)
        assert not verify_inclusion(leaf, index, n, proof, flip(root, rng.randrange(256)))
        other_indices = {index - 1, index + 1, index ^ 1, rng.randrange(n), n, n - 1 - index}
        for other in other_indices - {index}:
            assert not verify_inclusion(leaf, other, n, proof, root)
        # (The tree size is not tampered with: it is not hashed, so a proof can legitimately
        # verify for several sizes, e.g. leaf 0 of 10 or 11 leaves; the signed tree head binds it.)
        if proof:
            assert not verify_inclusion(leaf, index, n, proof[:-1], root)
            assert not verify_inclusion(leaf, index, n, [leaf, *proof], root)
        assert not verify_inclusion(leaf, index, n, [*proof, leaf], root)


SMALL_N = 40


def test_every_consistency_proof_verifies_for_small_trees() -> None:
    rng = random.Random(2024)
    leaves = random_leaves(rng, SMALL_N)
    tree = MerkleTree(leaves)
    roots = [tree.root(size) for size in range(SMALL_N + 1)]
    for second in range(1, SMALL_N + 1):
        for first in range(1, second + 1):
            proof = tree.consistency_proof(first, second)
            assert proof == ref_proof(first, leaves[:second])
            assert proof == consistency_proof(leaves, first, second)
            if first < second:
                assert len(proof) == merkle._consistency_proof_length(first, second)
            assert verify_consistency(first, second, roots[first], roots[second], proof)
            for i in range(len(proof)):
                tampered = [*proof[:i], flip(proof[i], rng.randrange(256)), *proof[i + 1 :]]
                assert not verify_consistency(first, second, roots[first], roots[second], tampered)
            assert not verify_consistency(first, second, flip(roots[first]), roots[second], proof)
            assert not verify_consistency(first, second, roots[first], flip(roots[second], 255), proof)
            # The same proof with other sizes (and those sizes' true roots) fails.
            for other_first in {first - 1, first + 1} - {first, 0}:
                if other_first <= second:
                    assert not verify_consistency(other_first, second, roots[other_first], roots[second], proof)
            for other_second in {second - 1, second + 1} - {second}:
                if first <= other_second <= SMALL_N:
                    assert not verify_consistency(first, other_second, roots[first], roots[other_second], proof)
            if first < second:
                assert not verify_consistency(first, second, roots[second], roots[first], proof)
                assert not verify_consistency(first, second, roots[first], roots[second], proof[:-1])
                assert not verify_consistency(first, second, roots[first], roots[second], [*proof, roots[first]])


@pytest.mark.parametrize("second", [64, 100, 129, 256, 300])
def test_consistency_proofs_in_larger_trees(second: int) -> None:
    rng = random.Random(second)
    leaves = random_leaves(rng, second)
    tree = MerkleTree(leaves)
    root2 = tree.root(second)
    for first in range(1, second + 1):
        proof = tree.consistency_proof(first, second)
        root1 = root_from_leaf_hashes(leaves[:first])
        assert verify_consistency(first, second, root1, root2, proof)
        if proof:
            i = rng.randrange(len(proof))
            assert not verify_consistency(
                first, second, root1, root2, [*proof[:i], flip(proof[i], rng.randrange(256)), *proof[i + 1 :]]
            )
        assert not verify_consistency(first, second, flip(root1), root2, proof)
        assert not verify_consistency(first, second, root1, flip(root2), proof)


def test_proofs_over_a_longer_list_use_only_the_first_tree_size_leaves() -> None:
    rng = random.Random(7)
    leaves = random_leaves(rng, 50)
    for size in (1, 17, 32, 49):
        root = root_from_leaf_hashes(leaves[:size])
        for index in range(size):
            assert verify_inclusion(leaves[index], index, size, inclusion_proof(leaves, index, size), root)
        for first in range(1, size + 1):
            proof = consistency_proof(leaves, first, size)
            assert verify_consistency(first, size, root_from_leaf_hashes(leaves[:first]), root, proof)


# --- the compact range (frontier) ---------------------------------------------------------


def test_compact_range_matches_the_root_at_every_size_and_survives_storage() -> None:
    rng = random.Random(300)
    leaves = random_leaves(rng, 300)
    compact = CompactRange()
    assert compact.size == 0 and compact.root() == EMPTY_ROOT and compact.to_hex() == []
    for size in range(301):
        if size:
            compact.append(leaves[size - 1])
        expected = root_from_leaf_hashes(leaves[:size])
        assert compact.size == size
        assert compact.root() == expected
        assert len(compact.hashes) == size.bit_count() <= size.bit_length()
        stored = json.loads(json.dumps({"size": compact.size, "frontier": compact.to_hex()}))
        restored = CompactRange.from_hex(stored["size"], stored["frontier"])
        assert restored == compact
        assert restored.root() == expected
        # A restored range keeps growing exactly like the original.
        if size < 300:
            restored.append(leaves[size])
            assert restored.root() == root_from_leaf_hashes(leaves[: size + 1])


def test_compact_range_frontier_is_the_perfect_subtrees_from_the_left() -> None:
    compact = CompactRange()
    compact.extend(LEAF_HASHES[:7])
    levels = VECTORS["node_hashes_by_level"]["levels"]
    assert compact.to_hex() == [levels[2][0], levels[1][2], levels[0][6]]
    copy = compact.copy()
    copy.append(LEAF_HASHES[7])
    assert copy.to_hex() == [VECTORS["roots"]["8"]]
    assert compact.size == 7 and compact.root() == h(VECTORS["roots"]["7"])


def test_compact_range_extend_in_batches_matches_one_by_one() -> None:
    rng = random.Random(11)
    leaves = random_leaves(rng, 1000)
    compact = CompactRange()
    position = 0
    while position < len(leaves):
        batch = rng.randrange(1, 90)
        compact = CompactRange.from_hex(compact.size, compact.to_hex())  # persisted between batches
        compact.extend(leaves[position : position + batch])
        position = min(position + batch, len(leaves))
        assert compact.root() == root_from_leaf_hashes(leaves[:position])


def test_compact_range_rejects_bad_storage_and_bad_leaves() -> None:
    compact = CompactRange()
    compact.extend(LEAF_HASHES[:5])
    stored = compact.to_hex()
    # The count of hashes must match the set bits of the size (5 = 0b101: two).
    with pytest.raises(ValueError):
        CompactRange.from_hex(4, stored)
    with pytest.raises(ValueError):
        CompactRange.from_hex(7, stored)
    with pytest.raises(ValueError):
        CompactRange.from_hex(5, [stored[0].upper(), stored[1]])
    with pytest.raises(ValueError):
        CompactRange.from_hex(5, [stored[0][:-2], stored[1]])
    with pytest.raises(ValueError):
        CompactRange.from_hex(-1, [])
    with pytest.raises(ValueError):
        CompactRange.from_hex(1, stored[0])  # a bare string is not a list of hashes
    with pytest.raises(ValueError):
        compact.append(b"\x00" * 31)
    with pytest.raises(TypeError):
        compact.append(stored[0])  # type: ignore[arg-type]
    assert compact.size == 5  # failed appends change nothing
    assert CompactRange.from_hex(0, []) == CompactRange()


# --- scale and independence ---------------------------------------------------------------


def _root_of_identical_leaves(leaf: bytes, n: int) -> bytes:
    """With every leaf equal, every perfect subtree of 2**h leaves has the same hash, so the
    root of n leaves folds the pieces of n's binary decomposition in O(log n) hashes."""
    perfect = [leaf]
    while 1 << len(perfect) <= n:
        perfect.append(node_hash(perfect[-1], perfect[-1]))
    pieces = [perfect[height] for height in range(n.bit_length()) if n >> height & 1]  # smallest first
    result = pieces[0]
    for piece in pieces[1:]:
        result = node_hash(piece, result)
    return result


def test_a_million_leaves_is_iterative_and_linear() -> None:
    n = 1_000_000
    leaf = leaf_hash(b"same")
    limit = sys.getrecursionlimit()
    started = time.perf_counter()
    root = root_from_leaf_hashes([leaf] * n)
    elapsed = time.perf_counter() - started
    assert sys.getrecursionlimit() == limit
    assert root == _root_of_identical_leaves(leaf, n)
    for size in (1, 2, 3, 5, 8, 255, 256, 257, 1000, 4097):
        assert root_from_leaf_hashes([leaf] * size) == _root_of_identical_leaves(leaf, size) == ref_mth([leaf] * size)
    print(f"root of {n} leaves in {elapsed:.2f}s")


@pytest.mark.slow
def test_a_million_distinct_leaves_agree_across_root_tree_frontier_and_proofs() -> None:
    n = 1_000_000
    leaves = [i.to_bytes(32, "big") for i in range(n)]  # any 32 bytes will do as a leaf hash
    root = root_from_leaf_hashes(leaves)
    tree = MerkleTree(leaves)
    assert tree.root() == root
    compact = tree.compact_range(n - 1000)
    compact.extend(leaves[n - 1000 :])
    assert compact.root() == root
    rng = random.Random(n)
    for index in [0, n - 1, *(rng.randrange(n) for _ in range(50))]:
        assert verify_inclusion(leaves[index], index, n, tree.inclusion_proof(index), root)
    for first in [1, 2**19, 2**19 + 1, n - 1, *(rng.randrange(1, n) for _ in range(50))]:
        proof = tree.consistency_proof(first)
        assert verify_consistency(first, n, tree.root(first), root, proof)


def test_compact_range_from_a_tree_matches_appending() -> None:
    rng = random.Random(5)
    leaves = random_leaves(rng, 130)
    tree = MerkleTree(leaves)
    compact = CompactRange()
    for size in range(131):
        assert tree.compact_range(size) == compact
        if size < 130:
            compact.append(leaves[size])
    assert tree.compact_range() == compact


def test_the_module_needs_nothing_but_the_standard_library() -> None:
    path = Path(merkle.__file__)
    tree = ast.parse(path.read_text())
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert imported <= {"__future__", "hashlib", "collections"}
    # Loaded by path, without the backplane package (which sets up Celery and Django).
    script = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('merkle', {str(path)!r})\n"
        "module = importlib.util.module_from_spec(spec); sys.modules['merkle'] = module\n"
        "spec.loader.exec_module(module)\n"
        "assert not [m for m in sys.modules if m.split('.')[0] in ('django', 'celery', 'backplane')]\n"
        "print(module.root_from_leaf_hashes([module.leaf_hash(b'')]).hex())\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == VECTORS["roots"]["1"]
