"""The condition language of tool policies (recovery/approval_rules.py): what is accepted, what
is refused with its reason, and how a call's input is judged, failing closed."""

from __future__ import annotations

import time
from typing import Any

import pytest

from recovery.approval_rules import MAX_CONDITION_CHARS, RuleError, parse_condition

PAYMENT = {"amount": "number", "currency": "string", "urgent": "boolean", "count": "integer",
           "payee.country": "string"}


@pytest.mark.parametrize(("condition", "arguments", "needed"), [
    ("", {}, True),
    ("amount > 1000", {"amount": 1000.5}, True),
    ("amount > 1000", {"amount": 1000}, False),
    ("amount >= 1000 and currency == 'EUR'", {"amount": 1000, "currency": "EUR"}, True),
    ("amount >= 1000 and currency == 'EUR'", {"amount": 1000, "currency": "USD"}, False),
    ("amount > 1000 or urgent", {"amount": 1, "urgent": True}, True),
    ("not urgent", {"urgent": True}, False),
    ("urgent == False", {"urgent": False}, True),
    ("100 < amount <= 1000", {"amount": 1000}, True),
    ("100 < amount <= 1000", {"amount": 100}, False),
    ("payee.country not in ['DE', 'FR']", {"payee": {"country": "US"}}, True),
    ("payee.country in ('DE', 'FR')", {"payee": {"country": "US"}}, False),
    ("count != 3", {"count": 3.0}, False),  # JSON 3.0 is the integer 3
    ("amount > -5", {"amount": -4}, True),
    ("amount == count", {"amount": 2, "count": 2}, True),
])
def test_it_judges_a_calls_input(condition: str, arguments: dict[str, Any], needed: bool) -> None:
    assert parse_condition(condition, PAYMENT).needs_approval(arguments).needed is needed


@pytest.mark.parametrize(("arguments", "missing"), [
    ({}, "'amount' is missing or not a number"),
    ({"amount": "5000"}, "'amount' is missing or not a number"),
    ({"amount": True}, "'amount' is missing or not a number"),
    ({"amount": None}, "'amount' is missing or not a number"),
    ({"amount": 5, "payee": "DE"}, "'payee.country' is missing or not a string"),
    ([1, 2], "'amount' is missing or not a number"),
])
def test_an_input_it_cannot_judge_asks_for_approval(arguments: Any, missing: str) -> None:
    """Leaving a field out, or sending it as another type, must not get a call past the gate."""
    verdict = parse_condition("amount > 1000 or payee.country == 'XX'", PAYMENT).needs_approval(arguments)
    assert verdict.needed and missing in verdict.reason


def test_a_short_circuit_decides_without_the_fields_it_does_not_need() -> None:
    condition = parse_condition("amount > 1000 or currency == 'EUR'", PAYMENT)
    assert condition.needs_approval({"amount": 5000}).needed
    assert not parse_condition("amount > 1000 and currency == 'EUR'", PAYMENT).needs_approval({"amount": 5}).needed


@pytest.mark.parametrize(("condition", "fields", "reason"), [
    ("amount >", PAYMENT, "does not parse"),
    ("amount > 1000; import os", PAYMENT, "does not parse"),
    ("__import__('os').system('true')", PAYMENT, "is not allowed here"),
    ("amount.__class__ == 1", PAYMENT, "not a declared field"),
    ("open('x') == 1", PAYMENT, "is not a field or a constant"),
    ("amount + 1 > 5", PAYMENT, "is not a field or a constant"),
    ("amounts[0] > 5", PAYMENT, "is not a field or a constant"),
    ("(lambda: 1)() == 1", PAYMENT, "is not a field or a constant"),
    ("[x for x in amount] == 1", PAYMENT, "is not a field or a constant"),
    ("f'{amount}' == 'x'", PAYMENT, "is not a field or a constant"),
    ("amount", PAYMENT, "alone is not true or false"),
    ("1 < 2", PAYMENT, "compares no field"),
    ("price > 5", PAYMENT, "'price' is not a declared field"),
    ("amount > 'a lot'", PAYMENT, "is not a number"),
    ("amount == True", PAYMENT, "is not a number"),
    ("currency > 'A'", PAYMENT, "orders numbers only"),
    ("urgent < True", PAYMENT, "orders numbers only"),
    ("amount == currency", PAYMENT, "compares a number with a string"),
    ("currency in 'EUR USD'", PAYMENT, "must be a list of constants"),
    ("currency in ['EUR', 5]", PAYMENT, "is not a string"),
    ("currency in [amount]", PAYMENT, "must be a constant"),
    ("amount is None", PAYMENT, "is not allowed"),
    ("amount > 5", {"amount": "money"}, "unknown type 'money'"),
    ("amount > 5", {"amount": None}, "unknown type None"),
    ("x > 5", {"x y": "number"}, "is not a name or a dotted path"),
    ("x > 5", ["x"], "fields must be an object"),
    ("(" * 300 + "urgent" + ")" * 300, PAYMENT, "does not parse"),
    (" or ".join(["urgent"] * 150), PAYMENT, "more than 200 parts"),
    ("urgent or " * 300 + "urgent", PAYMENT, f"longer than {MAX_CONDITION_CHARS} characters"),
    ("currency in [" + ", ".join(["'A'"] * 101) + "]", PAYMENT, "more than"),
])
def test_it_refuses_a_condition_with_the_reason(condition: str, fields: Any, reason: str) -> None:
    with pytest.raises(RuleError) as refused:
        parse_condition(condition, fields)
    assert reason in str(refused.value), str(refused.value)


def test_the_longest_texts_allowed_are_checked_and_judged_fast() -> None:
    """Operators write conditions, but a pasted wall of text must not hold a web process."""
    started = time.perf_counter()
    for text in ("urgent and " * 200, "(" * 1000):
        with pytest.raises(RuleError):
            parse_condition(text[:MAX_CONDITION_CHARS], PAYMENT)
    longest = parse_condition("amount > " + "9" * (MAX_CONDITION_CHARS - 9), PAYMENT)
    widest = parse_condition(" or ".join(["urgent"] * 99), PAYMENT)
    for _ in range(100):
        assert not longest.needs_approval({"amount": 5}).needed
        assert not widest.needs_approval({"urgent": False}).needed
    assert time.perf_counter() - started < 1.0
