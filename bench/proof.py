"""Proof serving as the sealed tree grows: inclusion and consistency proofs at 1,000, 10,000,
100,000 and 1,000,000 leaves, from the stored perfect subtrees (``MerkleNode``).

    .venv/bin/python bench/proof.py [--sizes 1000,10000,100000,1000000] [--proofs 300] [--json PATH]

Set-up (not timed): a scratch database (bench/_support.py). Synthetic leaves, (position, 64-hex
hash) pairs (the leaf table's event column has no foreign key), are sealed through the sealer's
own path, ``sealing._append_leaves_and_sign``: leaves, the nodes they complete and a signed head,
written with COPY in one transaction, ten heads on the way to each size. Then ``ANALYZE`` of the
leaf and node tables, as autovacuum would leave them.

Timed at each size, after a few untimed proofs:
- ``--proofs`` inclusion proofs of random leaves against the latest head, through
  ``sealing.inclusion_proof_for_event`` (what ``GET /api/v1/events/{position}/proof/`` calls);
- ``--proofs`` consistency proofs from a random earlier signed head to the latest, through
  ``sealing.consistency_proof_between``;
each as the median wall time and this process's CPU time (``time.process_time``: the database
server's own work is only in the wall time), and the rows its queries returned (psycopg's
``rowcount``). Every proof is verified against the signed roots (untimed). Once per size, what
proofs cost before the stored nodes: every leaf read and the tree rebuilt (``merkle.MerkleTree``).

The target: an inclusion proof at 1,000,000 leaves takes at most twice its time at 1,000
(``proof_ratio_1m_1k=<x>``, the median wall times; the line ``bench/http_bench.py`` reads).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from _support import bench_database

HEADS_PER_SIZE = 10


def label(size: int) -> str:
    for unit, name in ((1_000_000, "m"), (1_000, "k")):
        if size >= unit and size % unit == 0:
            return f"{size // unit}{name}"
    return str(size)


def event_hash(i: int) -> str:
    return hashlib.sha256(b"bench leaf %d" % i).hexdigest()


def seal_up_to(size: int) -> None:
    """Grow the tree to ``size`` leaves through the sealer's path, ``HEADS_PER_SIZE`` heads on the way."""
    from django.db import transaction

    from backplane.integrity import sealing
    from backplane.integrity.models import SignedTreeHead

    head = SignedTreeHead.objects.order_by("-tree_size").first()
    start = head.tree_size if head else 0
    step = max(1, (size - start) // HEADS_PER_SIZE)
    boundaries = sorted({*range(start + step, size, step), size})
    for end in boundaries:
        begin = head.tree_size if head else 0
        with transaction.atomic(durable=True):
            head = sealing._append_leaves_and_sign(head, [(i + 1, event_hash(i)) for i in range(begin, end)], now=None)


@contextmanager
def rows_read() -> Iterator[list[int]]:
    from django.db import connection

    counts: list[int] = []

    def count(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
        result = execute(sql, params, many, context)
        counts.append(context["cursor"].rowcount)
        return result

    with connection.execute_wrapper(count):
        yield counts


def timed(call: Callable[[], Any]) -> tuple[float, float, int, Any]:
    """(wall ms, CPU ms, rows read, result) of one call."""
    with rows_read() as counts:
        wall, cpu = time.perf_counter(), time.process_time()
        result = call()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return wall * 1000, cpu * 1000, sum(counts), result


def measure(size: int, proofs: int, rng: random.Random) -> dict[str, Any]:
    from django.db import connection

    from backplane.integrity import merkle, sealing
    from backplane.integrity.models import MerkleNode, SignedTreeHead

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE backplane_merkleleaf")
        cursor.execute("ANALYZE backplane_merklenode")
        cursor.execute(
            "SELECT pg_total_relation_size('backplane_merkleleaf'), pg_total_relation_size('backplane_merklenode')"
        )
        leaf_bytes, node_bytes = cursor.fetchone()
    heads = {h.tree_size: bytes.fromhex(h.root_hash) for h in SignedTreeHead.objects.only("tree_size", "root_hash")}
    assert max(heads) == size
    root = heads[size]
    earlier = sorted(s for s in heads if s < size) or [size]

    def inclusion() -> tuple[float, float, int]:
        index = rng.randrange(size)
        wall, cpu, rows, (leaf_index, tree_size, path) = timed(
            lambda: sealing.inclusion_proof_for_event(position=index + 1, tree_size=None)
        )
        proof = [bytes.fromhex(h) for h in path]
        assert merkle.verify_inclusion(merkle.event_leaf_hash(event_hash(index)), leaf_index, tree_size, proof, root)
        return wall, cpu, rows

    def consistency() -> tuple[float, float, int]:
        first = rng.choice(earlier)
        wall, cpu, rows, path = timed(lambda: sealing.consistency_proof_between(first=first, second=size))
        proof = [bytes.fromhex(h) for h in path]
        assert merkle.verify_consistency(first, size, heads[first], root, proof)
        return wall, cpu, rows

    for _ in range(20):  # warm the caches and the connection
        inclusion()
        consistency()
    inclusions = [inclusion() for _ in range(proofs)]
    consistencies = [consistency() for _ in range(proofs)]

    # Before the stored nodes: every leaf read and the tree rebuilt, for one proof.
    wall, cpu = time.perf_counter(), time.process_time()
    with connection.cursor() as cursor:
        cursor.execute("SELECT event_hash FROM backplane_merkleleaf WHERE leaf_index < %s ORDER BY leaf_index", [size])
        tree = merkle.MerkleTree([merkle.event_leaf_hash(h) for (h,) in cursor.fetchall()])
    tree.inclusion_proof(rng.randrange(size), size)
    rebuild_cpu, rebuild_wall = time.process_time() - cpu, time.perf_counter() - wall

    def median(samples: list[tuple[float, float, int]], at: int) -> float:
        return statistics.median(sample[at] for sample in samples)

    return {
        "leaves": size,
        "nodes": MerkleNode.objects.count(),
        "leaf_table_bytes": leaf_bytes,
        "node_table_bytes": node_bytes,
        "inclusion_wall_ms": median(inclusions, 0),
        "inclusion_cpu_ms": median(inclusions, 1),
        "inclusion_rows_median": median(inclusions, 2),
        "inclusion_rows_max": max(sample[2] for sample in inclusions),
        "consistency_wall_ms": median(consistencies, 0),
        "consistency_cpu_ms": median(consistencies, 1),
        "consistency_rows_median": median(consistencies, 2),
        "consistency_rows_max": max(sample[2] for sample in consistencies),
        "rebuild_wall_ms": rebuild_wall * 1000,
        "rebuild_cpu_ms": rebuild_cpu * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--sizes", default="1000,10000,100000,1000000", help="tree sizes to measure at, ascending, comma-separated"
    )
    parser.add_argument("--proofs", type=int, default=300, help="proofs of each kind at each size")
    parser.add_argument("--seed", type=int, default=6962)
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON (bench/http_bench.py reads it)")
    args = parser.parse_args()
    sizes = sorted({int(size) for size in args.sizes.split(",")})
    rng = random.Random(args.seed)

    results = []
    with bench_database():
        for size in sizes:
            started = time.perf_counter()
            seal_up_to(size)
            sealed_in = time.perf_counter() - started
            results.append(measure(size, args.proofs, rng))
            print(f"  {size:>9,} leaves sealed in {sealed_in:.1f}s, measured", flush=True)

    print(f"proof bench: {args.proofs} proofs of each kind at each size, median; rows = rows the queries returned")
    print(
        f"{'leaves':>10} {'nodes':>8} | {'inclusion wall':>14} {'cpu':>8} {'rows':>9} | "
        f"{'consistency wall':>16} {'cpu':>8} {'rows':>9} | {'rebuild (before)':>16}"
    )
    for r in results:
        print(
            f"{r['leaves']:>10,} {r['nodes']:>8,} | "
            f"{r['inclusion_wall_ms']:>11.2f} ms {r['inclusion_cpu_ms']:>5.2f} ms "
            f"{r['inclusion_rows_median']:>4.0f}/{r['inclusion_rows_max']:<4} | "
            f"{r['consistency_wall_ms']:>13.2f} ms {r['consistency_cpu_ms']:>5.2f} ms "
            f"{r['consistency_rows_median']:>4.0f}/{r['consistency_rows_max']:<4} | {r['rebuild_wall_ms']:>13.1f} ms"
        )
    last = results[-1]
    print(
        f"storage at {last['leaves']:,} leaves: nodes {last['node_table_bytes'] / 2**20:.1f} MiB with their index "
        f"({last['node_table_bytes'] / last['leaves']:.1f} bytes a leaf), "
        f"leaves {last['leaf_table_bytes'] / 2**20:.1f} MiB "
        f"({last['leaf_table_bytes'] / last['leaves']:.0f} bytes a leaf)"
    )
    first = results[0]
    name = f"{label(last['leaves'])}_{label(first['leaves'])}"
    ratio = last["inclusion_wall_ms"] / first["inclusion_wall_ms"]
    consistency_ratio = last["consistency_wall_ms"] / first["consistency_wall_ms"]
    print(
        f"inclusion at {last['leaves']:,} / at {first['leaves']:,} leaves: {ratio:.2f} (target <= 2); "
        f"consistency: {consistency_ratio:.2f}"
    )
    print(f"proof_ratio_{name}={ratio:.3f}")
    if args.json:
        figures: dict[str, Any] = {f"proof_ratio_{name}": ratio, f"consistency_ratio_{name}": consistency_ratio}
        for r in (first, last):
            figures[f"inclusion_ms_{label(r['leaves'])}"] = r["inclusion_wall_ms"]
        figures[f"consistency_ms_{label(last['leaves'])}"] = last["consistency_wall_ms"]
        figures["sizes"] = results
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
