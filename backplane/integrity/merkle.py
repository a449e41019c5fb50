"""RFC 6962 / RFC 9162 (section 2.1) Merkle trees: hashes, roots, proofs and their verifiers.

Pure Python on ``hashlib`` with no Django import, so the offline verifier can use it
without a database.

- A leaf hash is SHA-256(0x00 || data), an interior node SHA-256(0x01 || left || right),
  and the root of the empty tree SHA-256("").
- The tree over n leaves splits at the largest power of two smaller than n (MTH).
- Leaf indices start at 0; proofs list hashes from the leaf upward, as RFC 9162 verifies them.
- The leaf input of an event is the 32 raw bytes of its hex ``hash`` (docs/api.md, "Integrity").

Every function here takes and returns raw 32-byte hashes; ``hash_from_hex`` and
``hashes_to_hex`` convert at the edges (API, storage).

``MerkleTree`` builds proofs from every leaf; a log that stores the perfect subtrees
``CompactRange`` reports as it grows builds them from O(log n) stored hashes instead
(``inclusion_plan`` / ``consistency_plan``, ``stored_keys``, ``fold_plan``).

The verifiers follow RFC 9162 sections 2.1.3.2 and 2.1.4.2 step by step and reject malformed
input the way transparency-dev/merkle does: an index outside the tree, a proof of the wrong
length, a hash that is not 32 bytes, a first tree larger than the second, and any
consistency proof from the empty tree (``first == 0``), even to another empty tree.
One published transparency-dev probe fixes a corner: for ``first == second`` the roots are
only compared byte for byte, whatever their length (that statement is trivially true;
callers check the roots themselves against signed tree heads).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence

__all__ = [
    "EMPTY_ROOT",
    "HASH_SIZE",
    "CompactRange",
    "MerkleTree",
    "NodeKey",
    "PerfectNode",
    "consistency_plan",
    "consistency_proof",
    "event_leaf_hash",
    "fold_plan",
    "hash_from_hex",
    "hashes_to_hex",
    "inclusion_plan",
    "inclusion_proof",
    "leaf_hash",
    "node_hash",
    "perfect_pieces",
    "root_from_leaf_hashes",
    "stored_keys",
    "stored_ranges",
    "verify_consistency",
    "verify_inclusion",
]

HASH_SIZE = 32
LEAF_PREFIX = b"\x00"
NODE_PREFIX = b"\x01"

_sha256 = hashlib.sha256

EMPTY_ROOT: bytes = _sha256(b"").digest()

_HEX_DIGITS = frozenset("0123456789abcdef")

# (level, index): the perfect subtree of the 2**level leaves from leaf index * 2**level; level 0
# is one leaf. Such a subtree never changes once its last leaf is appended.
NodeKey = tuple[int, int]
# (level, index, hash) of a perfect subtree, as ``CompactRange`` reports it when it completes.
PerfectNode = tuple[int, int, bytes]


# --- hashing ---------------------------------------------------------------------------


def leaf_hash(data: bytes) -> bytes:
    """SHA-256(0x00 || data)."""
    return _sha256(LEAF_PREFIX + bytes(data)).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """SHA-256(0x01 || left || right). Children are taken as raw bytes, whatever their length."""
    return _sha256(NODE_PREFIX + bytes(left) + bytes(right)).digest()


def hash_from_hex(text: str) -> bytes:
    """A 32-byte hash from exactly 64 lowercase hex digits (the only spelling the API uses)."""
    if not isinstance(text, str) or len(text) != 2 * HASH_SIZE or not _HEX_DIGITS.issuperset(text):
        raise ValueError(f"expected {2 * HASH_SIZE} lowercase hex digits, got {text!r}")
    return bytes.fromhex(text)


def hashes_to_hex(hashes: Iterable[bytes]) -> list[str]:
    return [bytes(h).hex() for h in hashes]


def event_leaf_hash(hex_hash: str) -> bytes:
    """The leaf hash of an event: its hex ``hash`` as 32 raw bytes, hashed as a leaf."""
    return leaf_hash(hash_from_hex(hex_hash))


def _checked_hash(value: object, what: str = "leaf hash") -> bytes:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise TypeError(f"{what} must be bytes, not {type(value).__name__}")
    value = bytes(value)
    if len(value) != HASH_SIZE:
        raise ValueError(f"{what} must be {HASH_SIZE} bytes, got {len(value)}")
    return value


def _checked_leaves(leaf_hashes: Iterable[bytes]) -> list[bytes]:
    return [h if type(h) is bytes and len(h) == HASH_SIZE else _checked_hash(h) for h in leaf_hashes]


def _is_size(value: object) -> bool:
    return type(value) is int and value >= 0


def _largest_power_of_two_below(n: int) -> int:
    """The k of MTH's split: the largest power of two strictly smaller than n (n >= 2)."""
    return 1 << ((n - 1).bit_length() - 1)


# --- roots -----------------------------------------------------------------------------


def root_from_leaf_hashes(leaf_hashes: Sequence[bytes]) -> bytes:
    """MTH over the given leaf hashes, level by level in O(n) time.

    Hashing pairs level by level and carrying an unpaired last node up unchanged builds
    exactly RFC 6962's tree (split at the largest power of two below n): the left part of
    every split is a perfect subtree, so only the right border ever has an odd node.
    """
    level = _checked_leaves(leaf_hashes)
    if not level:
        return EMPTY_ROOT
    sha256 = _sha256
    node = NODE_PREFIX
    while len(level) > 1:
        paired = len(level) & ~1
        upper = [sha256(node + level[i] + level[i + 1]).digest() for i in range(0, paired, 2)]
        if paired != len(level):
            upper.append(level[-1])
        level = upper
    return level[0]


class MerkleTree:
    """All perfect subtrees of a list of leaves, for repeated roots and proofs.

    ``levels[L][i]`` is the hash of the 2**L leaves starting at ``i * 2**L`` (complete
    subtrees only). Building costs about n hashes; afterwards the root of any prefix, an
    inclusion proof or a consistency proof costs O(log n) hashes, because every subtree
    RFC 6962 recurses into is a run of such perfect subtrees.
    """

    __slots__ = ("_levels",)

    def __init__(self, leaf_hashes: Iterable[bytes]) -> None:
        level = _checked_leaves(leaf_hashes)
        levels = [level]
        sha256 = _sha256
        node = NODE_PREFIX
        while len(level) > 1:
            level = [sha256(node + level[i] + level[i + 1]).digest() for i in range(0, len(level) - 1, 2)]
            levels.append(level)
        self._levels = levels

    @property
    def size(self) -> int:
        return len(self._levels[0])

    def leaf_hash(self, index: int) -> bytes:
        return self._levels[0][index]

    def _subtree_hash(self, start: int, end: int) -> bytes:
        """MTH(D[start:end]) for a subtree RFC 6962 can reach (start is a multiple of the
        smallest power of two >= end - start): fold its perfect pieces from the right."""
        pieces = []
        position, remaining = start, end - start
        while remaining:
            height = remaining.bit_length() - 1
            pieces.append(self._levels[height][position >> height])
            position += 1 << height
            remaining -= 1 << height
        result = pieces.pop()
        while pieces:
            result = _sha256(NODE_PREFIX + pieces.pop() + result).digest()
        return result

    def _check_tree_size(self, tree_size: int) -> None:
        if not _is_size(tree_size):
            raise ValueError(f"tree size must be a non-negative integer, got {tree_size!r}")
        if tree_size > self.size:
            raise ValueError(f"tree size {tree_size} exceeds the {self.size} leaves available")

    def root(self, tree_size: int | None = None) -> bytes:
        """The root of the first ``tree_size`` leaves (all of them by default)."""
        if tree_size is None:
            tree_size = self.size
        self._check_tree_size(tree_size)
        if tree_size == 0:
            return EMPTY_ROOT
        return self._subtree_hash(0, tree_size)

    def compact_range(self, tree_size: int | None = None) -> CompactRange:
        """The frontier of the first ``tree_size`` leaves, e.g. to start sealing from a rebuilt tree."""
        if tree_size is None:
            tree_size = self.size
        self._check_tree_size(tree_size)
        frontier = []
        position, remaining = 0, tree_size
        while remaining:
            height = remaining.bit_length() - 1
            frontier.append(self._levels[height][position >> height])
            position += 1 << height
            remaining -= 1 << height
        return CompactRange._restore(tree_size, frontier)

    def inclusion_proof(self, index: int, tree_size: int | None = None) -> list[bytes]:
        """PATH(index, D[0:tree_size]) (RFC 6962 §2.1.1), from the leaf upward."""
        if tree_size is None:
            tree_size = self.size
        self._check_tree_size(tree_size)
        if not _is_size(index) or index >= tree_size:
            raise ValueError(f"leaf index {index!r} is outside a tree of size {tree_size}")
        top_down = []
        start, end, m = 0, tree_size, index
        while end - start > 1:
            k = _largest_power_of_two_below(end - start)
            if m < k:
                top_down.append(self._subtree_hash(start + k, end))
                end = start + k
            else:
                top_down.append(self._subtree_hash(start, start + k))
                start += k
                m -= k
        top_down.reverse()
        return top_down

    def consistency_proof(self, first: int, second: int | None = None) -> list[bytes]:
        """PROOF(first, D[0:second]) (RFC 6962 §2.1.2, SUBPROOF with its ``b`` flag),
        from the bottom upward. Requires 0 < first <= second; first == second gives []."""
        if second is None:
            second = self.size
        self._check_tree_size(second)
        if not _is_size(first) or first == 0 or first > second:
            raise ValueError(f"no consistency proof from size {first!r} to size {second}")
        top_down = []
        start, end, m = 0, second, first
        complete = True  # SUBPROOF's b: the current subtree's first m leaves form the whole old tree
        while m != end - start:
            k = _largest_power_of_two_below(end - start)
            if m <= k:
                top_down.append(self._subtree_hash(start + k, end))
                end = start + k
            else:
                top_down.append(self._subtree_hash(start, start + k))
                start += k
                m -= k
                complete = False
        if not complete:
            top_down.append(self._subtree_hash(start, end))
        top_down.reverse()
        return top_down


def _tree_over(leaf_hashes: Sequence[bytes], tree_size: int) -> MerkleTree:
    if not _is_size(tree_size):
        raise ValueError(f"tree size must be a non-negative integer, got {tree_size!r}")
    if tree_size > len(leaf_hashes):
        raise ValueError(f"tree size {tree_size} exceeds the {len(leaf_hashes)} leaves given")
    return MerkleTree(leaf_hashes[:tree_size])


def inclusion_proof(leaf_hashes: Sequence[bytes], index: int, tree_size: int) -> list[bytes]:
    """PATH(index, D[0:tree_size]) over the first ``tree_size`` of ``leaf_hashes``."""
    return _tree_over(leaf_hashes, tree_size).inclusion_proof(index, tree_size)


def consistency_proof(leaf_hashes: Sequence[bytes], first: int, second: int) -> list[bytes]:
    """PROOF(first, D[0:second]) over the first ``second`` of ``leaf_hashes``."""
    return _tree_over(leaf_hashes, second).consistency_proof(first, second)


# --- proofs from stored perfect subtrees -------------------------------------------------
#
# Every hash in an RFC 6962 proof is MTH of a subtree the recursion reaches, and every such
# subtree is a run of perfect subtrees (one per set bit of its size, largest first). A log that
# keeps the hash of each perfect subtree once it is complete (``CompactRange`` reports them)
# can therefore answer any proof from O(log n) stored hashes, without reading the other leaves:
#
# 1. ``inclusion_plan`` / ``consistency_plan`` name the perfect subtrees of each proof entry.
#    Only the right border, where the tree is not perfect, gives an entry of several pieces,
#    so a plan has at most about 2 log2(n) pieces.
# 2. A log may store only some levels ("tiles" of ``tile_height`` levels, as transparency logs
#    do): levels that are multiples of ``tile_height``, level 0 being the leaves themselves.
#    ``stored_keys`` turns the plan into the stored hashes it needs: a piece at level L comes
#    from the 2**(L mod tile_height) stored hashes below it, at level L - L mod tile_height.
#    ``stored_ranges`` groups them into index ranges, to read by primary key.
# 3. ``fold_plan`` folds what was read into the proof, from the leaf upward.
#
# The plans mirror ``MerkleTree``'s proofs step by step; the tests hold them to each other.


def perfect_pieces(start: int, end: int) -> list[NodeKey]:
    """The perfect subtrees, largest (leftmost) first, that make up the leaves [start, end) of a
    subtree RFC 6962 can reach (start a multiple of the largest of them): one per set bit of
    ``end - start``. Their hashes folded from the right give MTH(D[start:end])."""
    if not (_is_size(start) and _is_size(end)) or end < start:
        raise ValueError(f"no subtree spans leaves [{start!r}, {end!r})")
    pieces = []
    position, remaining = start, end - start
    while remaining:
        height = remaining.bit_length() - 1
        if position & ((1 << height) - 1):
            raise ValueError(f"leaves [{start}, {end}) are not a subtree of an RFC 6962 tree")
        pieces.append((height, position >> height))
        position += 1 << height
        remaining -= 1 << height
    return pieces


def inclusion_plan(index: int, tree_size: int) -> list[list[NodeKey]]:
    """PATH(index, D[0:tree_size]) as perfect subtrees: for each proof entry, from the leaf
    upward, the pieces whose fold is that entry (see ``MerkleTree.inclusion_proof``)."""
    if not _is_size(tree_size):
        raise ValueError(f"tree size must be a non-negative integer, got {tree_size!r}")
    if not _is_size(index) or index >= tree_size:
        raise ValueError(f"leaf index {index!r} is outside a tree of size {tree_size}")
    top_down = []
    start, end, m = 0, tree_size, index
    while end - start > 1:
        k = _largest_power_of_two_below(end - start)
        if m < k:
            top_down.append(perfect_pieces(start + k, end))
            end = start + k
        else:
            top_down.append(perfect_pieces(start, start + k))
            start += k
            m -= k
    top_down.reverse()
    return top_down


def consistency_plan(first: int, second: int) -> list[list[NodeKey]]:
    """PROOF(first, D[0:second]) as perfect subtrees, from the bottom upward (see
    ``MerkleTree.consistency_proof``). Requires 0 < first <= second; first == second gives []."""
    if not _is_size(second):
        raise ValueError(f"tree size must be a non-negative integer, got {second!r}")
    if not _is_size(first) or first == 0 or first > second:
        raise ValueError(f"no consistency proof from size {first!r} to size {second}")
    top_down = []
    start, end, m = 0, second, first
    complete = True  # SUBPROOF's b: the current subtree's first m leaves form the whole old tree
    while m != end - start:
        k = _largest_power_of_two_below(end - start)
        if m <= k:
            top_down.append(perfect_pieces(start + k, end))
            end = start + k
        else:
            top_down.append(perfect_pieces(start, start + k))
            start += k
            m -= k
            complete = False
    if not complete:
        top_down.append(perfect_pieces(start, end))
    top_down.reverse()
    return top_down


def _check_tile_height(tile_height: int) -> None:
    if type(tile_height) is not int or tile_height < 1:
        raise ValueError(f"tile height must be a positive integer, got {tile_height!r}")


def _stored_span(piece: NodeKey, tile_height: int) -> tuple[int, int, int]:
    """(stored level, first index, end index) of the stored hashes a piece is folded from."""
    level, index = piece
    stored_level = level - level % tile_height
    width = 1 << (level - stored_level)
    return stored_level, index * width, (index + 1) * width


def stored_keys(plan: Iterable[Iterable[NodeKey]], *, tile_height: int) -> list[NodeKey]:
    """The stored hashes (level, index) a plan needs when only levels that are multiples of
    ``tile_height`` are stored (level 0: the leaf hashes), sorted, each once."""
    _check_tile_height(tile_height)
    keys: set[NodeKey] = set()
    for entry in plan:
        for piece in entry:
            stored_level, first, end = _stored_span(piece, tile_height)
            keys.update((stored_level, i) for i in range(first, end))
    return sorted(keys)


def stored_ranges(keys: Iterable[NodeKey], *, gap: int = 0) -> dict[int, list[tuple[int, int]]]:
    """``keys`` as index ranges [first, end) per level, ascending. Two ranges of one level less
    than ``gap`` indices apart become one (reading a few rows more saves an index descent)."""
    ranges: dict[int, list[tuple[int, int]]] = {}
    for level, index in sorted(set(keys)):
        runs = ranges.setdefault(level, [])
        if runs and index - runs[-1][1] <= gap:
            runs[-1] = (runs[-1][0], index + 1)
        else:
            runs.append((index, index + 1))
    return ranges


def fold_plan(plan: Sequence[Sequence[NodeKey]], stored: Mapping[NodeKey, bytes], *, tile_height: int) -> list[bytes]:
    """The proof a plan describes, from the stored hashes it needs (``stored_keys``): each
    piece folded from the stored level below it, each entry's pieces from the right."""
    _check_tile_height(tile_height)
    sha256 = _sha256
    node = NODE_PREFIX
    proof = []
    for entry in plan:
        result = b""
        for level, index in reversed(entry):
            depth = level % tile_height
            if depth:  # a perfect subtree of 2**depth stored hashes: pair by pair, level by level
                first = index << depth
                row = [stored[(level - depth, i)] for i in range(first, first + (1 << depth))]
                while len(row) > 1:
                    row = [sha256(node + row[i] + row[i + 1]).digest() for i in range(0, len(row), 2)]
                piece = row[0]
            else:
                piece = stored[(level, index)]
            result = sha256(node + piece + result).digest() if result else piece
        proof.append(result)
    return proof


# --- verification ----------------------------------------------------------------------


# The verifiers reject malformed input of any type, whatever their annotations say: these checks
# take ``object``, so a check of an argument's type is not taken for dead code.
def _is_bytes(value: object) -> bool:
    return isinstance(value, bytes | bytearray)


def _is_hash(value: object) -> bool:
    return isinstance(value, bytes | bytearray) and len(value) == HASH_SIZE


def _is_proof(proof: object) -> bool:
    return isinstance(proof, list | tuple) and all(_is_hash(item) for item in proof)


def _inclusion_proof_length(index: int, tree_size: int) -> int:
    """The exact length of PATH(index, D[tree_size]): the levels below the point where the
    paths to ``index`` and to the last leaf part, plus one left sibling per set bit above."""
    inner = (index ^ (tree_size - 1)).bit_length()
    return inner + (index >> inner).bit_count()


def _consistency_proof_length(first: int, second: int) -> int:
    """The exact length of PROOF(first, D[second]) for 0 < first < second."""
    shift = (first & -first).bit_length() - 1  # trailing zero bits of first
    length = _inclusion_proof_length(first - 1, second) - shift
    return length if first == 1 << shift else length + 1


def verify_inclusion(leaf_hash: bytes, index: int, tree_size: int, proof: Sequence[bytes], root: bytes) -> bool:
    """RFC 9162 §2.1.3.2: does ``proof`` show ``leaf_hash`` at ``index`` in the tree ``root``?"""
    if not (_is_size(index) and _is_size(tree_size) and index < tree_size):
        return False
    if not (_is_hash(leaf_hash) and _is_hash(root) and _is_proof(proof)):
        return False
    if len(proof) != _inclusion_proof_length(index, tree_size):
        return False
    fn, sn = index, tree_size - 1
    r = bytes(leaf_hash)
    for p in proof:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    return sn == 0 and r == bytes(root)


def verify_consistency(first: int, second: int, first_root: bytes, second_root: bytes, proof: Sequence[bytes]) -> bool:
    """RFC 9162 §2.1.4.2: does ``proof`` show the tree ``first_root`` of size ``first`` is a
    prefix of the tree ``second_root`` of size ``second``? Requires 0 < first <= second."""
    if not (_is_size(first) and _is_size(second)) or first > second or first == 0:
        return False
    if not isinstance(proof, list | tuple):
        return False
    if not (_is_bytes(first_root) and _is_bytes(second_root)):
        return False
    if first == second:
        return len(proof) == 0 and bytes(first_root) == bytes(second_root)
    if not (_is_hash(first_root) and _is_hash(second_root) and _is_proof(proof)):
        return False
    if len(proof) != _consistency_proof_length(first, second):
        return False
    path = [bytes(h) for h in proof]
    if first & (first - 1) == 0:  # first is an exact power of two
        path.insert(0, bytes(first_root))
    fn, sn = first - 1, second - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    return fr == bytes(first_root) and sr == bytes(second_root) and sn == 0


# --- the growing tree ------------------------------------------------------------------


class CompactRange:
    """The right frontier of a growing tree: the roots of its perfect subtrees, largest
    (leftmost) first, one per set bit of ``size`` (so at most log2(n) + 1 hashes).

    Appending k leaves costs O(k) amortised hashes and the root O(log n), without
    re-reading old leaves. ``to_hex`` / ``from_hex`` store and restore it; the size is
    stored beside it (the frontier's length alone does not determine it).
    """

    __slots__ = ("_size", "_hashes")

    def __init__(self) -> None:
        self._size = 0
        self._hashes: list[bytes] = []

    @property
    def size(self) -> int:
        return self._size

    @property
    def hashes(self) -> tuple[bytes, ...]:
        return tuple(self._hashes)

    def append(self, leaf_hash: bytes) -> list[PerfectNode]:
        """Add one leaf. Returns the perfect subtrees of two or more leaves it completes, as
        (level, index, hash), lowest first: those a log stores to serve proofs (``fold_plan``)."""
        completed: list[PerfectNode] = []
        self._append(_checked_hash(leaf_hash), completed, 1)
        return completed

    def extend(self, leaf_hashes: Iterable[bytes], *, level_multiple: int = 1) -> list[PerfectNode]:
        """Add leaves in order. Returns the perfect subtrees they complete whose level is a
        positive multiple of ``level_multiple`` (every level by default), in the order completed."""
        if type(level_multiple) is not int or level_multiple < 1:
            raise ValueError(f"level_multiple must be a positive integer, got {level_multiple!r}")
        completed: list[PerfectNode] = []
        for h in leaf_hashes:
            self._append(_checked_hash(h), completed, level_multiple)
        return completed

    def _append(self, leaf_hash: bytes, completed: list[PerfectNode], level_multiple: int) -> None:
        hashes = self._hashes
        hashes.append(leaf_hash)
        # Each trailing 1 bit of the old size is a perfect subtree that now has a sibling: merged,
        # they complete the subtree one level up, whose index is the old size shifted that far.
        size = self._size
        level = 0
        while size & 1:
            right = hashes.pop()
            hashes[-1] = node = _sha256(NODE_PREFIX + hashes[-1] + right).digest()
            size >>= 1
            level += 1
            if not level % level_multiple:
                completed.append((level, size, node))
        self._size += 1

    def root(self) -> bytes:
        if not self._hashes:
            return EMPTY_ROOT
        result = self._hashes[-1]
        for h in reversed(self._hashes[:-1]):
            result = _sha256(NODE_PREFIX + h + result).digest()
        return result

    def copy(self) -> CompactRange:
        return CompactRange._restore(self._size, list(self._hashes))

    def to_hex(self) -> list[str]:
        """The frontier as lowercase hex, largest subtree first; store ``size`` with it."""
        return hashes_to_hex(self._hashes)

    @classmethod
    def from_hex(cls, size: int, hashes: Sequence[str]) -> CompactRange:
        """Restore what ``to_hex`` gave for a tree of ``size`` leaves; the count of hashes
        must match the set bits of ``size``."""
        if not _is_size(size):
            raise ValueError(f"size must be a non-negative integer, got {size!r}")
        if isinstance(hashes, str) or len(hashes) != size.bit_count():
            raise ValueError(f"a tree of {size} leaves has {size.bit_count()} frontier hashes")
        return cls._restore(size, [hash_from_hex(h) for h in hashes])

    @classmethod
    def from_hashes(cls, size: int, hashes: Sequence[bytes]) -> CompactRange:
        """Like ``from_hex``, from raw 32-byte hashes (the perfect subtrees ``perfect_pieces(0, size)``
        names, e.g. folded from stored nodes with ``fold_plan``)."""
        if not _is_size(size):
            raise ValueError(f"size must be a non-negative integer, got {size!r}")
        if _is_bytes(hashes) or len(hashes) != size.bit_count():
            raise ValueError(f"a tree of {size} leaves has {size.bit_count()} frontier hashes")
        return cls._restore(size, [_checked_hash(h, "frontier hash") for h in hashes])

    @classmethod
    def _restore(cls, size: int, hashes: list[bytes]) -> CompactRange:
        new = cls()
        new._size = size
        new._hashes = hashes
        return new

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CompactRange):
            return NotImplemented
        return self._size == other._size and self._hashes == other._hashes

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"CompactRange(size={self._size}, root={self.root().hex()})"
