"""What recording usage costs an append, in process: an ``LLMCalled`` with usage (validated,
priced from the table, summed into the rollups in the append's transaction) against the same
payload appended as a plain client event, in alternating rounds on one task each.

    .venv/bin/python bench/costs.py [--rounds 8] [--appends 300] [--out var/bench]

Target: the model call's append at most 1.10 × the plain one.

Beside it, in the same rounds, the database's own share ("floor"): the same statements written
with psycopg alone, no Django, no hashing — a plain append (lock the task, insert the event and
update the task in one statement, commit) against a model call's (the same, plus the price read,
the five rollup rows upserted in the insert's statement, and the budgets read with a lock). The
floor's ratio is what the design costs before any Python; the product's cannot be below it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from decimal import Decimal
from pathlib import Path

from _support import bench_database

PROMPT = [{"role": "user", "content": "Score the lead Acme Ltd, 40 employees, hiring engineers."}]


class RawFloor:
    """The statements of both appends with psycopg alone, on tables of their own."""

    ROLLUP_KEYS = ("task", "tree", "agent", "model", "namespace")

    def __init__(self, url: str) -> None:
        import psycopg

        self.conn = psycopg.connect(url)
        self.conn.autocommit = True
        self.conn.execute("CREATE TABLE floor_task (id int PRIMARY KEY, last_seq int NOT NULL)")
        self.conn.execute("CREATE TABLE floor_event (position bigserial PRIMARY KEY, task_id int, seq int,"
                          " payload jsonb, hash text, UNIQUE (task_id, seq))")
        self.conn.execute("CREATE TABLE floor_rollup (scope text, key text, hour timestamptz, calls bigint,"
                          " tokens bigint, cost numeric, PRIMARY KEY (scope, key, hour))")
        self.conn.execute("CREATE TABLE floor_price (model text, token_type text, per_million numeric,"
                          " valid_from timestamptz, PRIMARY KEY (model, token_type, valid_from))")
        self.conn.execute("CREATE TABLE floor_budget (id serial PRIMARY KEY, scope text, key text)")
        self.conn.execute("INSERT INTO floor_price VALUES ('m', 'input', 3, '2026-01-01'),"
                          " ('m', 'output', 15, '2026-01-01')")
        self.conn.execute("INSERT INTO floor_task VALUES (1, 0), (2, 0)")
        self.conn.autocommit = False
        self.payload = json.dumps({"model": "m", "prompt": PROMPT, "output": {"score": 71},
                                   "usage": {"input_tokens": 812, "output_tokens": 64}})

    def run(self, appends: int, *, model_call: bool) -> float:
        task = 2 if model_call else 1
        started = time.perf_counter()
        for _ in range(appends):
            with self.conn.transaction():
                (seq,) = self.conn.execute("SELECT last_seq FROM floor_task WHERE id = %s FOR UPDATE",
                                           [task]).fetchone()
                if not model_call:
                    self.conn.execute(
                        "WITH e AS (INSERT INTO floor_event (task_id, seq, payload, hash) VALUES (%s, %s, %s, %s))"
                        " UPDATE floor_task SET last_seq = %s WHERE id = %s",
                        [task, seq + 1, self.payload, "0" * 64, seq + 1, task])
                    continue
                self.conn.execute("SELECT token_type, per_million FROM floor_price WHERE model = 'm'"
                                  " AND valid_from <= now()").fetchall()
                rollups = json.dumps([{"scope": scope, "key": "k"} for scope in self.ROLLUP_KEYS])
                self.conn.execute(
                    "WITH e AS (INSERT INTO floor_event (task_id, seq, payload, hash) VALUES (%s, %s, %s, %s)),"
                    " t AS (UPDATE floor_task SET last_seq = %s WHERE id = %s)"
                    " INSERT INTO floor_rollup SELECT scope, key, date_trunc('hour', now()), 1, 876, 0.00342"
                    " FROM jsonb_to_recordset(%s::jsonb) AS r(scope text, key text) ORDER BY scope, key"
                    " ON CONFLICT (scope, key, hour) DO UPDATE SET calls = floor_rollup.calls + 1,"
                    " tokens = floor_rollup.tokens + excluded.tokens, cost = floor_rollup.cost + excluded.cost",
                    [task, seq + 1, self.payload, "0" * 64, seq + 1, task, rollups])
                self.conn.execute("SELECT id FROM floor_budget WHERE (scope, key) IN (('namespace', 'n'),"
                                  " ('agent', 'n/a'), ('task', 't')) ORDER BY id FOR UPDATE").fetchall()
        return (time.perf_counter() - started) * 1e6 / appends

    def close(self) -> None:
        self.conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--appends", type=int, default=300)
    parser.add_argument("--out", default="var/bench")
    args = parser.parse_args()

    with bench_database() as url:
        from backplane.eventlog import services
        from backplane.eventlog.event_types import prompt_sha256
        from backplane.eventlog.models import ModelPrice
        from backplane.eventlog.writer import EventDraft

        for token_type, rate in (("input", "3"), ("output", "15"), ("cache_read", "0.3")):
            ModelPrice.objects.create(provider="bench", model="m", token_type=token_type, per_million=Decimal(rate),
                                      currency="USD", version="v1", valid_from="2026-01-01T00:00:00Z")
        payload = {"model": "m", "provider": "bench", "prompt": PROMPT, "prompt_sha256": prompt_sha256(PROMPT),
                   "output": {"score": 71, "qualified": True},
                   "usage": {"input_tokens": 812, "cache_read_input_tokens": 512, "output_tokens": 64}}
        plain_task = services.task_create(namespace="bench", kind="k", input={}, agent="bench").task
        model_task = services.task_create(namespace="bench", kind="k", input={}, agent="bench").task

        def run(task_id: uuid.UUID, kind: str, first_step: int) -> float:
            started = time.perf_counter()
            for n in range(args.appends):
                services.event_append(namespace="bench", task_id=task_id, agent="bench",
                                      draft=EventDraft(type=kind, payload={**payload, "step": first_step + n}))
            return (time.perf_counter() - started) * 1e6 / args.appends

        floor = RawFloor(url)
        plain, model, floor_plain, floor_model = [], [], [], []
        for round_ in range(args.rounds):  # alternating, so all see the same machine
            plain.append(run(plain_task.pk, "ModelAnswered", round_ * args.appends))
            model.append(run(model_task.pk, "LLMCalled", round_ * args.appends))
            floor_plain.append(floor.run(args.appends, model_call=False))
            floor_model.append(floor.run(args.appends, model_call=True))
        floor.close()

    result = {"appends_per_round": args.appends, "rounds": args.rounds,
              "plain_us": statistics.median(plain), "llm_called_us": statistics.median(model),
              "ratio": statistics.median(model) / statistics.median(plain),
              "floor_plain_us": statistics.median(floor_plain), "floor_model_us": statistics.median(floor_model),
              "floor_ratio": statistics.median(floor_model) / statistics.median(floor_plain)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "costs.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"medians of {args.rounds} alternating rounds of {args.appends} appends, in process")
    print(f"  plain client event, same payload:        {result['plain_us']:8.0f} µs")
    print(f"  LLMCalled (validated, priced, rolled up): {result['llm_called_us']:8.0f} µs")
    print(f"  ratio {result['ratio']:.3f} (target ≤ 1.10)")
    print(f"  floor, psycopg alone: plain {result['floor_plain_us']:.0f} µs,"
          f" model call {result['floor_model_us']:.0f} µs, ratio {result['floor_ratio']:.3f}")


if __name__ == "__main__":
    main()
