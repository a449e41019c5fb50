"""A deterministic stand-in for the LLM: the same task and step always "think" the same thing.

No network, no model: a generator seeded by the run's seed and the task picks among canned
thoughts, so the same task always gets the same thoughts. (A run as a whole is not repeatable:
task ids are new each time.) The agents still go through ``TaskSession.resume``, which gives a
recovered attempt the decision its crashed predecessor logged, as a real, non-deterministic
model needs. The payloads look like what a real agent records in ``ReasoningStepCompleted``: the
thought, the decision, the model and a token count.

Django-free: the agent processes import it.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

MODEL = "stand-in-1 (deterministic, seeded)"

_PLANS = (
    "Look the lead up in the CRM, have research score the company, then decide.",
    "Check the CRM first; a research sub-agent scores fit; act only on a qualified lead.",
    "Gather CRM history and research signals before committing to outreach.",
)
_SIGNALS = ("hiring engineers", "raised a round", "new CTO", "expanding to EU", "legacy stack",
            "public API launched", "churned a competitor", "headcount flat")


def rng(seed: int | str, *parts: object) -> random.Random:
    """A generator seeded from the run's seed and what is being decided (task, step, ...)."""
    digest = hashlib.sha256(":".join(str(p) for p in (seed, *parts)).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def _tokens(text: str) -> int:
    return max(1, len(text) // 4)


def plan(seed: int | str, task_id: str, lead: dict[str, Any]) -> dict[str, Any]:
    thought = rng(seed, task_id, "plan").choice(_PLANS)
    return {"thought": f"{thought} Lead {lead['id']} at {lead['company']}.", "decision": "research-then-decide",
            "model": MODEL, "tokens": _tokens(thought)}


def research(seed: int | str, task_id: str, lead: dict[str, Any], enrichment: dict[str, Any]) -> dict[str, Any]:
    """The research sub-agent's judgement: a fit score from 0 to 100 and the signals behind it."""
    r = rng(seed, task_id, "research")
    signals = r.sample(_SIGNALS, 3)
    score = min(100, int(enrichment.get("employees", 50) ** 0.5) + r.randint(20, 80))
    thought = f"{lead['company']}: {', '.join(signals)}; fit score {score}."
    return {"thought": thought, "decision": {"score": score, "signals": signals}, "model": MODEL,
            "tokens": _tokens(thought)}


def qualify(seed: int | str, task_id: str, lead: dict[str, Any], score: int) -> dict[str, Any]:
    qualified = score >= 50
    buys = qualified and rng(seed, task_id, "buys").random() < 0.6
    thought = (f"Score {score}: " + ("qualified" if qualified else "not a fit yet")
               + ("; they asked for the starter plan." if buys else "."))
    return {"thought": thought, "decision": {"qualified": qualified, "buys": buys}, "model": MODEL,
            "tokens": _tokens(thought)}


def summary(lead: dict[str, Any], outcome: dict[str, Any]) -> dict[str, Any]:
    thought = f"Done with {lead['id']}: " + ", ".join(f"{k}={v}" for k, v in sorted(outcome.items()))
    return {"thought": thought, "model": MODEL, "tokens": _tokens(thought)}
