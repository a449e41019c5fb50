"""Proofs from stored perfect subtrees ("tiles"): the pure planner and fold against ``MerkleTree``,
the nodes ``CompactRange`` reports, and the sealer's stored nodes serving every proof of a
100,000-leaf tree from O(log n) rows, including nodes a migration or an older sealer left out."""

from __future__ import annotations

import hashlib
import importlib
import math
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import DatabaseError, connection, transaction
from pytest_django import DjangoAssertNumQueries

from backplane.eventlog.errors import InvalidInput, NotFound
from backplane.integrity import merkle, sealing
from backplane.integrity.merkle import (
    CompactRange,
    MerkleTree,
    NodeKey,
    consistency_plan,
    fold_plan,
    inclusion_plan,
    perfect_pieces,
    root_from_leaf_hashes,
    stored_keys,
    stored_ranges,
    verify_consistency,
    verify_inclusion,
)
from backplane.integrity.models import MERKLE_TILE_HEIGHT, MerkleNode, SignedTreeHead
from tests.backplane.integrity.audit_support import as_attacker

H = MERKLE_TILE_HEIGHT


def leaves_of(n: int) -> list[bytes]:
    """Any 32 bytes will do as a leaf hash for the pure tests."""
    return [hashlib.sha256(i.to_bytes(8, "big")).digest() for i in range(n)]


def stored_of(leaves: list[bytes], tile_height: int) -> dict[NodeKey, bytes]:
    """What a log stores: the leaf hashes (level 0) and the nodes CompactRange reports."""
    stored = {(0, i): leaf for i, leaf in enumerate(leaves)}
    stored.update(
        ((level, index), node) for level, index, node in CompactRange().extend(leaves, level_multiple=tile_height)
    )
    return stored


def fold_from(plan: list[list[NodeKey]], stored: dict[NodeKey, bytes], tile_height: int) -> list[bytes]:
    """Fold with nothing but the hashes ``stored_keys`` names: a key it forgot is a KeyError."""
    needed = {key: stored[key] for key in stored_keys(plan, tile_height=tile_height)}
    return fold_plan(plan, needed, tile_height=tile_height)


# --- the pure planner and fold --------------------------------------------------------------


def test_perfect_pieces_are_one_subtree_per_set_bit_largest_first() -> None:
    assert perfect_pieces(0, 0) == []
    assert perfect_pieces(0, 13) == [(3, 0), (2, 2), (0, 12)]
    assert perfect_pieces(16, 23) == [(2, 4), (1, 10), (0, 22)]
    leaves = leaves_of(23)
    tree = MerkleTree(leaves)
    for start, end in [(0, 23), (16, 23), (20, 23), (8, 16)]:
        hashes = [
            root_from_leaf_hashes(leaves[i << level : (i + 1) << level]) for level, i in perfect_pieces(start, end)
        ]
        folded = hashes.pop()
        while hashes:
            folded = merkle.node_hash(hashes.pop(), folded)
        assert folded == root_from_leaf_hashes(leaves[start:end])
    assert tree.root(23) == root_from_leaf_hashes(leaves)
    for start, end in [(1, 3), (4, 12), (-1, 2), (5, 4)]:
        with pytest.raises(ValueError):
            perfect_pieces(start, end)


@pytest.mark.parametrize("tile_height", [1, 2, 3, 4])
def test_plans_fold_into_the_trees_proofs_for_every_index_and_size_up_to_70(tile_height: int) -> None:
    leaves = leaves_of(70)
    tree = MerkleTree(leaves)
    stored = stored_of(leaves, tile_height)
    for size in range(1, 71):
        for index in range(size):
            plan = inclusion_plan(index, size)
            assert fold_from(plan, stored, tile_height) == tree.inclusion_proof(index, size), (index, size)
        for first in range(1, size + 1):
            plan = consistency_plan(first, size)
            assert fold_from(plan, stored, tile_height) == tree.consistency_proof(first, size), (first, size)


def test_plans_at_random_large_sizes_fold_into_the_trees_proofs_from_few_pieces() -> None:
    n = 300_000
    leaves = leaves_of(n)
    tree = MerkleTree(leaves)
    stored = stored_of(leaves, H)
    rng = random.Random(6962)
    sizes = [n, 1 << 18, (1 << 18) + 1, (1 << 18) - 1, 65_536 + 16, *(rng.randrange(1, n + 1) for _ in range(40))]
    for size in sizes:
        root = tree.root(size)
        bound = 2 * (size.bit_length() + 1)
        for index in {0, size - 1, size // 2, *(rng.randrange(size) for _ in range(8))}:
            plan = inclusion_plan(index, size)
            assert sum(map(len, plan)) <= bound
            # Each piece is folded from at most 2**(H - 1) stored hashes, and the leaf's own
            # tile from at most 2**H - 1 leaves.
            assert len(stored_keys(plan, tile_height=H)) <= (1 << H) * (size.bit_length() + 1)
            proof = fold_from(plan, stored, H)
            assert proof == tree.inclusion_proof(index, size)
            assert verify_inclusion(leaves[index], index, size, proof, root)
        for first in {1, size, size - 1 or 1, *(rng.randrange(1, size + 1) for _ in range(8))}:
            plan = consistency_plan(first, size)
            assert sum(map(len, plan)) <= bound
            proof = fold_from(plan, stored, H)
            assert proof == tree.consistency_proof(first, size)
            assert verify_consistency(first, size, tree.root(first), root, proof)


def test_plans_reject_what_the_tree_rejects() -> None:
    for index, size in [(0, 0), (3, 3), (-1, 3), (1, -1)]:
        with pytest.raises(ValueError):
            inclusion_plan(index, size)
    for first, second in [(0, 0), (0, 3), (4, 3), (-1, 3)]:
        with pytest.raises(ValueError):
            consistency_plan(first, second)
    assert consistency_plan(5, 5) == []
    with pytest.raises(ValueError):
        stored_keys([[(3, 0)]], tile_height=0)


def test_stored_keys_name_the_stored_level_below_each_piece() -> None:
    assert stored_keys([[(4, 1)]], tile_height=4) == [(4, 1)]
    assert stored_keys([[(6, 1)]], tile_height=4) == [(4, 4), (4, 5), (4, 6), (4, 7)]
    assert stored_keys([[(2, 3)], [(0, 5)]], tile_height=4) == [(0, 5), (0, 12), (0, 13), (0, 14), (0, 15)]


def test_stored_ranges_join_runs_closer_than_the_gap() -> None:
    keys = [(0, 1), (0, 2), (0, 4), (0, 40), (4, 7), (4, 8), (8, 0)]
    assert stored_ranges(keys) == {0: [(1, 3), (4, 5), (40, 41)], 4: [(7, 9)], 8: [(0, 1)]}
    assert stored_ranges(keys, gap=2) == {0: [(1, 5), (40, 41)], 4: [(7, 9)], 8: [(0, 1)]}


# --- the nodes CompactRange reports ---------------------------------------------------------


def test_compact_range_reports_each_perfect_subtree_once_as_its_last_leaf_arrives() -> None:
    leaves = leaves_of(300)
    compact = CompactRange()
    seen = []
    for i, leaf in enumerate(leaves):
        completed = compact.append(leaf)
        # The subtrees whose last leaf is i: one per trailing 1 bit of i, lowest first.
        expected_keys = [(level, i >> level) for level in range(1, 10) if (i + 1) % (1 << level) == 0]
        assert [(level, index) for level, index, _ in completed] == expected_keys
        for level, index, node in completed:
            assert node == root_from_leaf_hashes(leaves[index << level : (index + 1) << level])
        seen += completed
        assert compact.root() == root_from_leaf_hashes(leaves[: i + 1])  # the frontier is unchanged by reporting
    assert len(seen) == sum(300 >> level for level in range(1, 10))
    assert len({(level, index) for level, index, _ in seen}) == len(seen)
    # extend reports the same, filtered to the stored levels, in batches restored in between.
    rng = random.Random(4)
    batched = CompactRange()
    reported = []
    while batched.size < 300:
        batched = CompactRange.from_hex(batched.size, batched.to_hex())
        reported += batched.extend(leaves[batched.size : batched.size + rng.randrange(1, 40)], level_multiple=4)
    assert reported == [node for node in seen if node[0] % 4 == 0] and batched == compact
    assert CompactRange().extend(leaves[:8]) == [node for node in seen if (node[1] + 1) << node[0] <= 8]
    with pytest.raises(ValueError):
        CompactRange().extend(leaves, level_multiple=0)


def test_a_frontier_is_restored_from_raw_hashes() -> None:
    leaves = leaves_of(13)
    compact = CompactRange()
    compact.extend(leaves)
    assert CompactRange.from_hashes(13, list(compact.hashes)) == compact
    with pytest.raises(ValueError):
        CompactRange.from_hashes(12, list(compact.hashes))
    bare: Any = compact.hashes[0]  # bare bytes are not a list of hashes
    with pytest.raises(ValueError):
        CompactRange.from_hashes(1, bare)
    with pytest.raises(ValueError):
        CompactRange.from_hashes(1, [b"short"])


# --- the sealer's stored nodes --------------------------------------------------------------


def event_hash(i: int) -> str:
    """A synthetic event hash for leaf i (the leaf table's event column has no foreign key)."""
    return hashlib.sha256(b"event %d" % i).hexdigest()


def seal_synthetic(boundaries: list[int]) -> list[SignedTreeHead]:
    """Seal leaves 0.. through the sealer's own path, one signed head at each boundary."""
    head = SignedTreeHead.objects.order_by("-tree_size").first()
    heads = []
    for end in boundaries:
        start = head.tree_size if head else 0
        with transaction.atomic():
            head = sealing._append_leaves_and_sign(head, [(i + 1, event_hash(i)) for i in range(start, end)], now=None)
        heads.append(head)
    return heads


def leaf_hashes(n: int) -> list[bytes]:
    return [merkle.event_leaf_hash(event_hash(i)) for i in range(n)]


def all_stored() -> dict[NodeKey, bytes]:
    return {
        (level, index): bytes(node) for level, index, node in MerkleNode.objects.values_list("level", "index", "hash")
    }


def expected_node_count(n: int) -> int:
    return sum(n >> level for level in range(H, n.bit_length() + 1, H))


@contextmanager
def rows_read() -> Iterator[list[int]]:
    """The rows each query returned, as psycopg counts them."""
    counts: list[int] = []

    def count(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
        result = execute(sql, params, many, context)
        counts.append(context["cursor"].rowcount)
        return result

    with connection.execute_wrapper(count):
        yield counts


def test_every_proof_of_a_100k_leaf_tree_verifies_against_its_signed_head(db: None) -> None:
    n = 100_000
    boundaries = [1, 2, 3, 16, 17, 100, 4096, 4097, 10_000, 33_333, 65_536, 65_537, 99_999, n]
    started = time.perf_counter()
    heads = seal_synthetic(boundaries)
    sealed_in = time.perf_counter() - started
    leaves = leaf_hashes(n)
    tree = MerkleTree(leaves)
    for head in heads:
        assert head.root_hash == tree.root(head.tree_size).hex()
    stored = all_stored()
    assert len(stored) == expected_node_count(n)
    assert {level for level, _ in stored} == {4, 8, 12, 16}
    stored.update(((0, i), leaf) for i, leaf in enumerate(leaves))

    # Every leaf, through the same plan and fold as the database path, from the stored nodes.
    root = bytes.fromhex(heads[-1].root_hash)
    started = time.perf_counter()
    for index in range(n):
        plan = inclusion_plan(index, n)
        proof = fold_plan(plan, stored, tile_height=H)
        assert verify_inclusion(leaves[index], index, n, proof, root), index
    every_leaf_in = time.perf_counter() - started

    # A few thousand through the database, against heads of several sizes.
    rng = random.Random(n)
    started = time.perf_counter()
    for _ in range(2000):
        head = rng.choice(heads)
        index = rng.randrange(head.tree_size)
        leaf_index, size, path = sealing.inclusion_proof_for_event(position=index + 1, tree_size=head.tree_size)
        proof = [bytes.fromhex(h) for h in path]
        assert (leaf_index, size) == (index, head.tree_size)
        assert verify_inclusion(leaves[index], index, size, proof, bytes.fromhex(head.root_hash))
    through_the_database_in = time.perf_counter() - started

    # Consistency between every pair of signed heads, through the database.
    for i, first in enumerate(heads):
        for second in heads[i:]:
            path = sealing.consistency_proof_between(first=first.tree_size, second=second.tree_size)
            assert verify_consistency(
                first.tree_size,
                second.tree_size,
                bytes.fromhex(first.root_hash),
                bytes.fromhex(second.root_hash),
                [bytes.fromhex(h) for h in path],
            )
    print(
        f"sealed {n} leaves in {sealed_in:.1f}s; every inclusion proof in memory in {every_leaf_in:.1f}s; "
        f"2000 through the database in {through_the_database_in:.1f}s"
    )


def test_a_proof_reads_a_logarithmic_number_of_rows_in_two_queries(
    db: None, django_assert_max_num_queries: DjangoAssertNumQueries
) -> None:
    heads = seal_synthetic([1, 4999, 5000, 65_536, 70_001])
    n = heads[-1].tree_size
    rng = random.Random(3)
    # At most 2**H rows a stored level for the tiles along the path, and a few for each piece
    # of the right border.
    bound = 8 * math.log2(n)
    reads = []
    for index in [0, n - 1, 65_535, 65_536, *(rng.randrange(n) for _ in range(200))]:
        with django_assert_max_num_queries(2), rows_read() as counts:
            sealing.inclusion_proof_for_event(position=index + 1, tree_size=None)
        reads.append(sum(counts))
    for head in heads[:-1]:
        with django_assert_max_num_queries(2), rows_read() as counts:
            sealing.consistency_proof_between(first=head.tree_size, second=n)
        reads.append(sum(counts))
    assert 0 < max(reads) <= bound, max(reads)


def test_the_backfill_stores_the_nodes_of_leaves_sealed_before_the_nodes_existed(db: None) -> None:
    heads = seal_synthetic([1000, 4097, 20_000, 20_003])
    n = heads[-1].tree_size
    sealed = all_stored()
    # The leaves of a database from before migration 0021: no node at all.
    as_attacker(("DELETE FROM backplane_merklenode", []))
    assert not MerkleNode.objects.exists()
    migration = importlib.import_module("backplane.migrations.0021_merkle_nodes")
    with connection.schema_editor() as editor:
        migration.backfill(None, editor)
    assert all_stored() == sealed and len(sealed) == expected_node_count(n)
    tree = MerkleTree(leaf_hashes(n))
    rng = random.Random(21)
    for head in heads:
        for index in [0, head.tree_size - 1, *(rng.randrange(head.tree_size) for _ in range(30))]:
            _, _, path = sealing.inclusion_proof_for_event(position=index + 1, tree_size=head.tree_size)
            assert [bytes.fromhex(h) for h in path] == tree.inclusion_proof(index, head.tree_size)
        path = sealing.consistency_proof_between(first=head.tree_size, second=n)
        assert [bytes.fromhex(h) for h in path] == tree.consistency_proof(head.tree_size, n)
    assert sealing.merkle_nodes_fill_missing(tree_size=n) == 0  # nothing left to fill


def test_leaves_an_older_sealer_appended_without_nodes_still_prove_and_get_their_nodes_next_run(
    db: None, caplog: pytest.LogCaptureFixture
) -> None:
    heads = seal_synthetic([3000, 9000])
    complete = all_stored()
    # Leaves 3000.. as the previous release's sealer appends them during a rolling upgrade:
    # leaves and a signed head, no node.
    as_attacker(("DELETE FROM backplane_merklenode WHERE (index + 1) << level > 3000", []))
    assert len(all_stored()) < len(complete)
    tree = MerkleTree(leaf_hashes(9000))
    for index in [0, 2999, 3000, 4095, 8191, 8999]:
        _, _, path = sealing.inclusion_proof_for_event(position=index + 1, tree_size=9000)
        assert [bytes.fromhex(h) for h in path] == tree.inclusion_proof(index, 9000)
    path = sealing.consistency_proof_between(first=3000, second=9000)
    assert [bytes.fromhex(h) for h in path] == tree.consistency_proof(3000, 9000)
    assert "not stored yet" in caplog.text
    # The next run of this sealer stores them, even with nothing new to seal...
    assert sealing.seal_new_events().sealed == 0
    assert all_stored() == complete
    # ...and one that seals stores its own after them.
    seal_synthetic([9001])
    assert len(all_stored()) == expected_node_count(9001)
    assert heads[-1].root_hash == tree.root().hex()


def test_a_proof_without_its_leaves_is_not_found(db: None) -> None:
    seal_synthetic([40])
    as_attacker(
        ("DELETE FROM backplane_merkleleaf WHERE leaf_index BETWEEN 16 AND 31", []),
        ("DELETE FROM backplane_merklenode", []),
    )
    with pytest.raises(NotFound, match="fewer than 40 leaves"):
        sealing.inclusion_proof_for_event(position=1, tree_size=40)
    with pytest.raises(NotFound, match="fewer than 40 leaves"):
        sealing.inclusion_proof_for_event(position=33, tree_size=40)
    with pytest.raises(InvalidInput):
        sealing.consistency_proof_between(first=40, second=1)


def test_stored_nodes_are_append_only(db: None) -> None:
    seal_synthetic([64])
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        MerkleNode.objects.filter(level=4, index=0).update(hash=b"\x00" * 32)
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        MerkleNode.objects.filter(level=4).delete()
    assert MerkleNode.objects.count() == 4


def test_the_stored_levels_are_still_those_the_rows_were_written_with() -> None:
    # Rows written by the sealer and migration 0021's backfill hold levels 4, 8, 12, ...: proofs
    # read with another tile height would miss them. Changing it needs a migration that rewrites
    # the table.
    assert MERKLE_TILE_HEIGHT == 4
