"""When a tool call needs a person's approval: the condition of a tool policy (docs/approvals.md).

A condition is one expression over the call's input, written the way people write it::

    amount > 1000 and currency == "EUR"
    payment.amount >= 500 or country not in ["DE", "FR"]

with the type of every field it names declared beside it (``{"amount": "number", "currency":
"string", "payment.amount": "number", "country": "string"}``). A dotted name is a path into
nested objects of the input. An empty condition means *always*.

Python's own parser (``ast``) reads the text; the tree is then checked against a short list of
node kinds and walked by this module. Nothing is compiled or evaluated by Python, so a
condition can compare and combine, and nothing else: no calls, no attributes beyond field paths,
no subscripts, no arithmetic. What is allowed:

- ``and``, ``or``, ``not``, parentheses;
- comparisons ``==`` ``!=`` ``<`` ``<=`` ``>`` ``>=`` (chains too: ``100 < amount <= 1000``),
  ``in`` and ``not in`` a list of constants;
- operands: declared fields, numbers, strings in quotes, ``True`` and ``False``.

Checked when a policy is saved (``parse_condition``), each refusal naming its reason: the text
parses; every name is a declared field and every declared field a known type (``number``,
``integer``, ``string``, ``boolean``); each comparison has a field on at least one side and its
two sides of one type; order comparisons only on numbers; bounds on the text's length and the
tree's size, so a condition costs little to check at every dispatch.

Evaluated at dispatch (``Condition.needs_approval``) against the call's input. A named field that
is missing, or whose value is not of its declared type, cannot be decided, and an undecidable
condition asks for approval: a gate that fails open would let an agent skip it by leaving a
field out.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

FIELD_TYPES = ("number", "integer", "string", "boolean")
MAX_CONDITION_CHARS = 2000
MAX_NODES = 200
MAX_FIELDS = 50
MAX_LIST_ITEMS = 100
MAX_PATH_CHARS = 200

_ORDER = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge}
_EQUALITY = {ast.Eq: operator.eq, ast.NotEq: operator.ne}
_SYMBOL = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.In: "in",
           ast.NotIn: "not in"}
_NUMERIC = ("number", "integer")


class RuleError(ValueError):
    """The condition or its fields are refused; the message says why, for the person saving it."""


class _Undecidable(Exception):
    def __init__(self, path: str, expected: str) -> None:
        super().__init__(path)
        self.path, self.expected = path, expected


@dataclass(frozen=True)
class Verdict:
    needed: bool
    reason: str


@dataclass(frozen=True)
class Condition:
    """A checked condition: ``text`` as saved, ``fields`` as declared, ``tree`` None for always."""

    text: str
    fields: Mapping[str, str]
    tree: ast.expr | None

    def needs_approval(self, arguments: Any) -> Verdict:
        if self.tree is None:
            return Verdict(True, "the policy asks for approval of every call")
        try:
            holds = _truth(self.tree, arguments, self.fields)
        except _Undecidable as undecidable:
            missing = f"input field {undecidable.path!r} is missing or not {_article(undecidable.expected)}"
            return Verdict(True, f"{missing}: the condition cannot be decided, so approval is asked for")
        if holds:
            return Verdict(True, f"the condition holds: {self.text}")
        return Verdict(False, f"the condition does not hold: {self.text}")


def parse_condition(text: str, fields: Any) -> Condition:
    """Check ``text`` against the declared ``fields`` (module docstring); RuleError says why not."""
    if not isinstance(text, str):
        raise RuleError("the condition must be text")
    if not isinstance(fields, dict):
        raise RuleError("fields must be an object of field name to type")
    declared = _check_fields(fields)
    text = text.strip()
    if not text:
        return Condition(text="", fields=declared, tree=None)
    if len(text) > MAX_CONDITION_CHARS:
        raise RuleError(f"the condition is longer than {MAX_CONDITION_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        detail = exc.msg if isinstance(exc, SyntaxError) else exc.__class__.__name__
        raise RuleError(f"the condition does not parse: {detail}") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise RuleError(f"the condition has more than {MAX_NODES} parts")
    _check_boolean(tree, declared)
    return Condition(text=text, fields=declared, tree=tree)


def _check_fields(fields: dict[Any, Any]) -> dict[str, str]:
    if len(fields) > MAX_FIELDS:
        raise RuleError(f"more than {MAX_FIELDS} fields")
    for name, kind in fields.items():
        if not isinstance(name, str) or not name or len(name) > MAX_PATH_CHARS or not all(
                part.isidentifier() for part in name.split(".")):
            raise RuleError(f"field {name!r} is not a name or a dotted path of names")
        if kind not in FIELD_TYPES:
            raise RuleError(f"field {name!r} has the unknown type {kind!r}; known: {', '.join(FIELD_TYPES)}")
    return dict(fields)


def _check_boolean(node: ast.expr, fields: Mapping[str, str]) -> None:
    """``node`` must give true or false: and/or/not of comparisons, or a boolean field alone."""
    if isinstance(node, ast.BoolOp):
        for value in node.values:
            _check_boolean(value, fields)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        _check_boolean(node.operand, fields)
    elif isinstance(node, ast.Compare):
        _check_comparison(node, fields)
    elif (path := _field_path(node)) is not None:
        if _declared_type(path, fields) != "boolean":
            raise RuleError(f"{path!r} alone is not true or false; compare it (for example {path} > 0)")
    else:
        raise RuleError(f"{_shown(node)!r} is not allowed here: a condition is comparisons joined by and, or, not")


def _check_comparison(node: ast.Compare, fields: Mapping[str, str]) -> None:
    operands = [node.left, *node.comparators]
    for op, left, right in zip(node.ops, operands[:-1], operands[1:], strict=True):
        symbol = _SYMBOL.get(type(op))
        if symbol is None:
            raise RuleError(f"the operator {type(op).__name__} is not allowed; use == != < <= > >= in, not in")
        if isinstance(op, (ast.In, ast.NotIn)):
            kind = _operand_type(left, fields)
            if kind is None:
                raise RuleError(f"the left of {symbol!r} must be a field")
            if not isinstance(right, (ast.List, ast.Tuple)):
                raise RuleError(f"the right of {symbol!r} must be a list of constants, such as [\"DE\", \"FR\"]")
            if len(right.elts) > MAX_LIST_ITEMS:
                raise RuleError(f"a list of more than {MAX_LIST_ITEMS} items")
            for item in right.elts:
                _check_constant_of(item, kind, symbol)
            continue
        kinds = [_operand_type(side, fields) for side in (left, right)]
        if kinds == [None, None]:
            raise RuleError(f"{_shown(left)} {symbol} {_shown(right)} compares no field")
        kind = next(k for k in kinds if k is not None)
        for side, side_kind in zip((left, right), kinds, strict=True):
            if side_kind is None:
                _check_constant_of(side, kind, symbol)
            elif _family(side_kind) != _family(kind):
                raise RuleError(f"{_shown(left)} {symbol} {_shown(right)} compares a {kinds[0]} with a {kinds[1]}")
        if isinstance(op, tuple(_ORDER)) and kind not in _NUMERIC:
            raise RuleError(f"{symbol!r} orders numbers only; {_shown(left)} {symbol} {_shown(right)} has a {kind}")


def _operand_type(node: ast.expr, fields: Mapping[str, str]) -> str | None:
    """A field's declared type, or None for a constant (checked by the caller); else refused."""
    path = _field_path(node)
    if path is not None:
        return _declared_type(path, fields)
    if isinstance(node, ast.Constant) or (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub)
                                          and isinstance(node.operand, ast.Constant)):
        return None
    raise RuleError(f"{_shown(node)!r} is not a field or a constant")


def _declared_type(path: str, fields: Mapping[str, str]) -> str:
    kind = fields.get(path)
    if kind is None:
        raise RuleError(f"{path!r} is not a declared field; declare it with its type")
    return kind


def _check_constant_of(node: ast.expr, kind: str, symbol: str) -> None:
    value = _constant(node)
    if value is _NOT_CONSTANT:
        raise RuleError(f"{_shown(node)!r} beside {symbol!r} must be a constant")
    if not _is_of(value, kind):
        raise RuleError(f"{_shown(node)} is not {_article(kind)}, the type it is compared with")


_NOT_CONSTANT = object()


def _constant(node: ast.expr) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        value = node.operand.value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value
    return _NOT_CONSTANT


def _field_path(node: ast.expr) -> str | None:
    """``a`` or ``a.b.c`` as a dotted path; None for anything else."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _family(kind: str) -> str:
    return "number" if kind in _NUMERIC else kind


def _is_of(value: Any, kind: str) -> bool:
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "string":
        return isinstance(value, str)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if isinstance(value, float) and not math.isfinite(value):
        return False
    return kind == "number" or isinstance(value, int) or value.is_integer()


def _article(kind: str) -> str:
    return {"integer": "an integer", "boolean": "a boolean"}.get(kind, f"a {kind}")


def _shown(node: ast.expr) -> str:
    try:
        return ast.unparse(node)[:80]
    except Exception:  # noqa: BLE001 - only for a message
        return type(node).__name__


# -- evaluation (the tree was checked: only the node kinds above reach here) --------------------


def _truth(node: ast.expr, arguments: Any, fields: Mapping[str, str]) -> bool:
    if isinstance(node, ast.BoolOp):
        if isinstance(node.op, ast.And):
            return all(_truth(value, arguments, fields) for value in node.values)
        return any(_truth(value, arguments, fields) for value in node.values)
    if isinstance(node, ast.UnaryOp):
        return not _truth(node.operand, arguments, fields)
    if isinstance(node, ast.Compare):
        operands = [node.left, *node.comparators]
        return all(_compare(op, left, right, arguments, fields)
                   for op, left, right in zip(node.ops, operands[:-1], operands[1:], strict=True))
    return bool(_value(node, arguments, fields))


def _compare(op: ast.cmpop, left: ast.expr, right: ast.expr, arguments: Any, fields: Mapping[str, str]) -> bool:
    if isinstance(op, (ast.In, ast.NotIn)):
        assert isinstance(right, (ast.List, ast.Tuple))
        # Both sides are of the field's type by now (saved lists were checked, values are checked
        # as read), so True never equals 1 here.
        value = _value(left, arguments, fields)
        found = any(value == _constant(item) for item in right.elts)
        return found if isinstance(op, ast.In) else not found
    compare: Callable[[Any, Any], bool] = {**_ORDER, **_EQUALITY}[type(op)]
    return compare(_value(left, arguments, fields), _value(right, arguments, fields))


def _value(node: ast.expr, arguments: Any, fields: Mapping[str, str]) -> Any:
    path = _field_path(node)
    if path is None:
        return _constant(node)
    kind = fields[path]
    value = arguments
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            raise _Undecidable(path, kind)
        value = value[part]
    if not _is_of(value, kind):
        raise _Undecidable(path, kind)
    return value
