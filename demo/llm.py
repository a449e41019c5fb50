"""A deterministic stand-in for the LLM, and the prompts the demo agents ask it.

No network, no model. Each decision the agents make (the plan, the research sub-agent's score,
the qualification, the summary) is a real prompt rendered from one of the templates below and a
*model function* that answers it the way ``TaskSession.model_call`` expects:
``call(prompt) -> {"output": ..., "usage": {"input_tokens": n, ...}}``. The agents go through
``model_call``, so every answer is recorded (``LLMCalled``: model, prompt, output, usage), a
recovered attempt gets the answer its crashed predecessor recorded, and a sandbox replay can
serve the answers from the record or ask the stand-in again.

The usage is what a hosted model would report (the keys of ``backplane_client.usage``), so the
server prices the demo's calls like real ones (provider ``demo``; model ``stand-in-large``, and
``stand-in-small`` for the summary): about four characters a token, the system prompt read from
the provider's cache on most calls and written to it on the rest, and reasoning tokens on the
qualification. Like the answer, it depends on the prompt alone: a replay records the usage its
source did.

The stand-in picks among canned thoughts with a generator seeded by the run's seed and the
prompt itself: the same prompt always gets the same answer (a replay with the prompts unchanged
agrees with the run it replays), and a changed prompt gets another one, as from a real model.
The model functions also see the structured values the prompt was rendered from (a score, an
enrichment), which a real model would read out of the prompt.

The templates are module constants, read when a prompt is rendered: a test changes one and
replays a task to see the drift. Django-free: the agent processes import it.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Mapping
from string import Template
from typing import Any

from backplane_client.usage import Usage

MODEL = "stand-in-large"
#: The model of the summary, which needs no large one (backplane/eventlog/prices.json prices both).
SMALL_MODEL = "stand-in-small"
PROVIDER = "demo"
#: How often a prompt finds the system prompt out of the provider's cache (and writes it there).
CACHE_MISS_RATE = 0.2
#: The reasoning tokens the qualification takes, from/to.
QUALIFY_REASONING = (96, 384)

# A prompt: chat messages, as most model APIs take them.
Prompt = list[dict[str, str]]
ModelFunction = Callable[[Any], Mapping[str, Any]]

SYSTEM_PROMPT = "You are the sales-operations agent of a B2B software company. Answer with one JSON object only."
PLAN_PROMPT = (
    "Plan how to qualify lead $lead_id, a contact at $company. You can look the lead up in the CRM, have a research "
    "sub-agent score how well the company fits, write the CRM, send an email and charge a card. "
    'Answer {"thought": "...", "decision": "..."}.'
)
RESEARCH_PROMPT = (
    "Score from 0 to 100 how well $company fits our product, from what the enrichment service found: $enrichment. "
    'Answer {"thought": "...", "decision": {"score": 0-100, "signals": ["three signals"]}}.'
)
QUALIFY_PROMPT = (
    "Lead $lead_id at $company has a fit score of $score. Is the lead qualified (a score of 50 or more), and did "
    'they ask for the starter plan? Answer {"thought": "...", "decision": {"qualified": true|false, '
    '"buys": true|false}}.'
)
SUMMARY_PROMPT = "Summarise for the CRM what was done for lead $lead_id: $outcome. Answer {\"thought\": \"...\"}."

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


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def render(template: str, **fields: Any) -> Prompt:
    """The chat messages for a template (``$name`` placeholders; objects are written as JSON)."""
    values = {name: value if isinstance(value, str | int) else _json(value) for name, value in fields.items()}
    return [{"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": Template(template).substitute(values)}]


def usage(prompt: Any, output: Any, *, reasoning: tuple[int, int] | None = None) -> Usage:
    """The tokens a hosted model would report for this answer, decided by the prompt alone.

    Totals include their parts, as ``LLMCalled`` counts them: the leading system message is the
    cached prefix (read from the cache, or on a miss written to it), and ``reasoning``, a range,
    adds that many tokens of thinking to the output.
    """
    r = rng("usage", _json(prompt))
    first = prompt[0] if isinstance(prompt, list) and prompt else None
    system = first if isinstance(first, dict) and first.get("role") == "system" else None
    counts: Usage = {"input_tokens": _tokens(_json(prompt)), "output_tokens": _tokens(_json(output))}
    if system is not None:
        if r.random() < CACHE_MISS_RATE:
            counts["cache_creation_input_tokens"] = _tokens(_json(system))
        else:
            counts["cache_read_input_tokens"] = _tokens(_json(system))
    if reasoning is not None:
        thinking = r.randint(*reasoning)
        counts["output_tokens"] += thinking
        counts["reasoning_output_tokens"] = thinking
    return counts


def _answer(prompt: Any, output: dict[str, Any], *, reasoning: tuple[int, int] | None = None) -> dict[str, Any]:
    """The model's answer as ``model_call`` takes it: the output and what it cost in tokens."""
    return {"output": output, "usage": usage(prompt, output, reasoning=reasoning)}


# --- the prompts -------------------------------------------------------------------------------


def plan_prompt(lead: Mapping[str, Any]) -> Prompt:
    return render(PLAN_PROMPT, lead_id=lead["id"], company=lead["company"])


def research_prompt(lead: Mapping[str, Any], enrichment: Mapping[str, Any]) -> Prompt:
    return render(RESEARCH_PROMPT, company=lead["company"], enrichment=dict(enrichment))


def qualify_prompt(lead: Mapping[str, Any], score: int) -> Prompt:
    return render(QUALIFY_PROMPT, lead_id=lead["id"], company=lead["company"], score=score)


def summary_prompt(lead: Mapping[str, Any], outcome: Mapping[str, Any]) -> Prompt:
    return render(SUMMARY_PROMPT, lead_id=lead["id"], outcome=dict(outcome))


# --- the stand-in's answers --------------------------------------------------------------------


def plan(seed: int | str, lead: Mapping[str, Any]) -> ModelFunction:
    def call(prompt: Any) -> dict[str, Any]:
        thought = rng(seed, "plan", _json(prompt)).choice(_PLANS)
        return _answer(prompt, {"thought": f"{thought} Lead {lead['id']} at {lead['company']}.",
                                "decision": "research-then-decide"})
    return call


def research(seed: int | str, lead: Mapping[str, Any], enrichment: Mapping[str, Any]) -> ModelFunction:
    """The research sub-agent's judgement: a fit score from 0 to 100 and the signals behind it."""
    def call(prompt: Any) -> dict[str, Any]:
        r = rng(seed, "research", _json(prompt))
        signals = r.sample(_SIGNALS, 3)
        score = min(100, int(enrichment.get("employees", 50) ** 0.5) + r.randint(20, 80))
        thought = f"{lead['company']}: {', '.join(signals)}; fit score {score}."
        return _answer(prompt, {"thought": thought, "decision": {"score": score, "signals": signals}})
    return call


def qualify(seed: int | str, lead: Mapping[str, Any], score: int) -> ModelFunction:
    def call(prompt: Any) -> dict[str, Any]:
        # An enterprise lead came asking for the annual plan: qualified and buying, whatever the score.
        enterprise = lead.get("plan") == "enterprise"
        qualified = score >= 50 or enterprise
        buys = enterprise or (qualified and rng(seed, "buys", _json(prompt)).random() < 0.6)
        plan = "the annual enterprise plan" if enterprise else "the starter plan"
        thought = (f"Score {score}: " + ("qualified" if qualified else "not a fit yet")
                   + (f"; they asked for {plan}." if buys else "."))
        # The one decision the stand-in thinks over before it answers.
        return _answer(prompt, {"thought": thought, "decision": {"qualified": qualified, "buys": buys}},
                       reasoning=QUALIFY_REASONING)
    return call


def summary(lead: Mapping[str, Any], outcome: Mapping[str, Any]) -> ModelFunction:
    def call(prompt: Any) -> dict[str, Any]:
        thought = f"Done with {lead['id']}: " + ", ".join(f"{k}={v}" for k, v in sorted(outcome.items()))
        return _answer(prompt, {"thought": thought})
    return call
