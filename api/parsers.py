"""The API's one request parser: strict JSON (docs/api.md, Conventions).

DRF's ``JSONParser`` hands the body to ``json.load``, which recurses once per nesting level:
ten kilobytes of ``[`` are a ``RecursionError`` (a 500), duplicate keys keep the last value
silently, ``\\ud800`` and ``\\u0000`` arrive as strings PostgreSQL refuses at INSERT, and ``1e400``
becomes ``inf``. This parser refuses all of that, as ``400 validation_error``, before anything
recurses:

1. the nesting depth is measured on the raw bytes, without recursion, before ``json.loads``
   sees them (a body with 64 brackets or fewer cannot be too deep, so nearly every request
   skips the scan);
2. ``json.loads`` runs with an ``object_pairs_hook`` that refuses duplicate keys and a
   ``parse_float``/``parse_constant`` that refuse anything that is not a finite double;
3. only when the raw text holds a ``\\u0000`` or ``\\uD800``-``\\uDFFF`` escape are the parsed
   strings (keys and values) walked for NUL and lone surrogates: a surrogate that survives
   parsing had no partner.

The body is UTF-8 (RFC 8259 section 8.1): a ``charset`` parameter naming anything else is
``415 unsupported_media_type`` (``media_type_charset_refused``), never a codec to decode with.
``us-ascii`` is a subset of UTF-8 and is read as UTF-8.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from itertools import accumulate
from typing import Any

from django.utils.http import parse_header_parameters
from rest_framework.exceptions import ParseError, UnsupportedMediaType
from rest_framework.parsers import JSONParser

MAX_DEPTH = 64

_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_STRUCTURE_ONLY = bytes(b for b in range(256) if b not in b'[]{}"')
# +1 for an opening bracket, -1 for a closing one, indexed by byte.
_DEPTH_STEP = [1 if b in b"[{" else -1 for b in range(256)]
_SUSPECT_ESCAPE = re.compile(rb"\\u(?:0000|[dD][89a-fA-F])")
_SURROGATE = re.compile("[\ud800-\udfff]")


# The spellings of UTF-8 (and of ASCII, which is UTF-8) a charset parameter may use, compared
# case-insensitively once quotes are gone.
UTF8_CHARSETS = frozenset({"utf-8", "utf8", "us-ascii", "ascii"})


class InvalidJSON(ValueError):
    pass


def charset_refused(charset: str | None) -> bool:
    """Whether a ``charset`` parameter names something other than UTF-8 (None: none was sent)."""
    return charset is not None and charset.strip().lower() not in UTF8_CHARSETS


def media_type_charset_refused(content_type: str) -> bool:
    """``charset_refused`` for a whole ``Content-Type`` value (``application/json; charset="UTF8"``)."""
    _, params = parse_header_parameters(content_type)
    return charset_refused(params.get("charset"))


def nesting_depth_exceeds(raw: bytes, limit: int = MAX_DEPTH) -> bool:
    """Whether any prefix of ``raw`` opens more than ``limit`` arrays and objects, outside strings.

    The parser recurses once per open bracket still unclosed, so this bounds its recursion
    for any input, well-formed or not: up to the first syntax error, its strings are ours.
    Every step is a C loop over the bytes: drop every backslash escape (so every quote left
    delimits a string), keep only brackets and quotes, drop the strings, then the running
    depth over the brackets left.
    """
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    if b"\\" in raw:
        raw = _ESCAPE.sub(b"", raw)
    # With escapes gone, quotes alternate opening and closing a string: the even pieces
    # between them are outside strings (an unterminated string is an odd last piece).
    outside = b"".join(raw.translate(None, _STRUCTURE_ONLY).split(b'"')[::2])
    return any(depth > limit for depth in accumulate(map(_DEPTH_STEP.__getitem__, outside)))


def _object_without_duplicates(
    pairs: list[tuple[str, Any]], _dict: type[dict[str, Any]] = dict, _len: Any = len
) -> dict[str, Any]:
    # dict and len bound as defaults: this runs once per JSON object, so lookups count.
    obj = _dict(pairs)
    if _len(obj) != _len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise InvalidJSON(f"duplicate object key {key!r}")
            seen.add(key)
    return obj


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise InvalidJSON(f"number {text[:40]} is outside the range of a double")
    return value


def _no_constants(name: str) -> Any:
    raise InvalidJSON(f"{name} is not JSON")


def _reject_nul_and_lone_surrogates(value: Any) -> None:
    """An explicit stack, not recursion: the depth is already bounded, but so is this loop's cost."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                raise InvalidJSON("strings may not contain U+0000")
            if _SURROGATE.search(item):
                raise InvalidJSON("strings may not contain a lone UTF-16 surrogate")
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def loads_strict(raw: bytes) -> Any:
    """Parse a UTF-8 request body, or raise ``InvalidJSON`` saying why not."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidJSON(f"the body is not valid UTF-8: {exc}") from None
    if nesting_depth_exceeds(raw):
        raise InvalidJSON(f"nested deeper than {MAX_DEPTH} levels")
    try:
        value = json.loads(
            text,
            object_pairs_hook=_object_without_duplicates,
            parse_float=_finite_float,
            parse_constant=_no_constants,
        )
    except InvalidJSON:
        raise
    except (ValueError, RecursionError) as exc:
        # ValueError covers JSONDecodeError and integers over Python's 4300-digit limit;
        # RecursionError cannot happen past the depth check but must never be a 500.
        raise InvalidJSON(str(exc)) from None
    if _SUSPECT_ESCAPE.search(raw):
        _reject_nul_and_lone_surrogates(value)
    return value


class StrictJSONParser(JSONParser):
    """DRF's JSON parser with the rules above; every failure is a ``ParseError`` (400
    validation_error), a charset other than UTF-8 an ``UnsupportedMediaType`` (415).

    DRF hands over ``request.encoding``, which Django sets from any charset that names a codec
    (``latin-1``, ``unicode_escape``): it is ignored, the ``media_type`` itself is checked."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Mapping[str, Any] | None = None) -> Any:
        if media_type and media_type_charset_refused(media_type):
            raise UnsupportedMediaType(media_type)
        raw = stream.read() if stream is not None else b""
        try:
            return loads_strict(raw)
        except InvalidJSON as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
