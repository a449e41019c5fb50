"""What recording usage costs an append, in process: an ``LLMCalled`` with usage (validated,
priced from the table, summed into the rollups in the append's transaction) against the same
payload appended as a plain client event, in alternating rounds on one task each.

    .venv/bin/python bench/costs.py [--rounds 8] [--appends 300] [--out var/bench]

Target: the model call's append at most 1.10 × the plain one.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--appends", type=int, default=300)
    parser.add_argument("--out", default="var/bench")
    args = parser.parse_args()

    with bench_database():
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

        plain, model = [], []
        for round_ in range(args.rounds):  # alternating, so both see the same machine
            plain.append(run(plain_task.pk, "ModelAnswered", round_ * args.appends))
            model.append(run(model_task.pk, "LLMCalled", round_ * args.appends))

    result = {"appends_per_round": args.appends, "rounds": args.rounds,
              "plain_us": statistics.median(plain), "llm_called_us": statistics.median(model),
              "ratio": statistics.median(model) / statistics.median(plain)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "costs.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"medians of {args.rounds} alternating rounds of {args.appends} appends, in process")
    print(f"  plain client event, same payload:        {result['plain_us']:8.0f} µs")
    print(f"  LLMCalled (validated, priced, rolled up): {result['llm_called_us']:8.0f} µs")
    print(f"  ratio {result['ratio']:.3f} (target ≤ 1.10)")


if __name__ == "__main__":
    main()
