"""Sealing personal values before anything hashes them, and opening them for those allowed.

A client marks a value anywhere in a request's JSON (docs/privacy.md)::

    {"$personal": {"subject": "lead:8812", "value": "ada@example.com", "lookup": true}}

and the server stores, hashes, exports and delivers only its envelope::

    {"$personal": {"subject": "lead:8812", "sealed": "<base64url: nonce, ciphertext, tag>"}}

AES-256-GCM under the subject's data key, bound to the namespace and subject (the additional
data), with a synthetic nonce: the HMAC of the value under the key's second half. The same value
of the same subject seals to the same envelope, so every comparison the product makes of stored
requests (an idempotent replay, a task created twice, a tool call's input, an approval bound to
its arguments) holds on envelopes as it did on clear values; the price is that two equal values
of one subject are seen to be equal. An envelope sent back as it was read (an agent passing a
sealed value on) is kept as it is, once it opens under the subject's key.

The steps that need the database are written once, as a generator of statements
(``_seal_steps``) that both drivers run: Django's connection (``seal_personal``) and the event
loop's (``seal_personal_async``). Opening (services.py) is for people's pages and the API's
opening route, on Django's connection only.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.utils import timezone

from backplane.eventlog.canonical import CanonicalizationError, canonical_json
from backplane.eventlog.chain import format_timestamp
from backplane.eventlog.errors import BackplaneError, InvalidInput, SubjectErased
from backplane.privacy.keys import KeyEncryptionKeys, KeyUnavailable, key_encryption_keys
from backplane.privacy.models import SUBJECT_MAX_LENGTH

MARK = "$personal"
DATA_KEY_BYTES = 64  # the cipher's 32 bytes, then the synthetic nonces' HMAC key
NONCE_BYTES = 12
# What one request may mark: the values sealed and the subjects whose keys are read for them.
PERSONAL_VALUES_MAX = 1000
SUBJECTS_MAX = 100
SEALED_MAX_CHARS = 400_000  # above the API's body limit: any envelope a request may carry

_MARKER_KEYS = frozenset({"subject", "value", "lookup"})
_ENVELOPE_KEYS = frozenset({"subject", "sealed"})


class KeysUnavailable(BackplaneError):
    """The key-encryption keys do not open a subject's key (misconfigured: docs/privacy.md)."""

    status = 503
    code = "unavailable"
    retry_after = 30


@dataclass(frozen=True)
class Found:
    """One marked value (``value``) or envelope (``sealed``) of a request, at ``path``."""

    path: tuple[str | int, ...]
    subject: str
    value: Any = None
    sealed: str | None = None
    lookup: bool = False


# --- the walk: markers and envelopes, checked ----------------------------------------------------


Path = tuple[str | int, ...]


def where(path: Path) -> str:
    """A path as the contract's error details name a field: ``events[0].payload.email``."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text or "body"


def personal_in(body: Any, *, bounded: bool = True) -> list[Found]:
    """Every marked value and envelope in ``body``, checked (400 naming the path at fault).
    ``bounded``: a request's, held to what one request may mark; False for what is stored."""
    # Most bodies mark nothing: a walk that builds no paths says so first (a third of the cost).
    if not personal_in_value(body):
        return []
    found: list[Found] = []
    _walk(body, found, bounded=bounded)
    if not bounded:
        return found
    if len(found) > PERSONAL_VALUES_MAX:
        raise InvalidInput("too many personal values in one request",
                           {"body": f"at most {PERSONAL_VALUES_MAX} personal values"})
    if len({item.subject for item in found}) > SUBJECTS_MAX:
        raise InvalidInput("too many data subjects in one request", {"body": f"at most {SUBJECTS_MAX} subjects"})
    return found


def _walk(value: Any, found: list[Found], *, bounded: bool) -> None:
    # Iterative: this walk runs over every agent write, most of which mark nothing.
    empty: Path = ()
    pending = [(value, empty)]
    while pending:
        item, at = pending.pop()
        if type(item) is dict:
            if MARK in item:
                found.append(_marker(item, at))
                if bounded and len(found) > PERSONAL_VALUES_MAX:
                    return
                continue
            pending.extend((member, (*at, key)) for key, member in item.items()
                           if type(member) is dict or type(member) is list)
        elif type(item) is list:
            pending.extend((member, (*at, index)) for index, member in enumerate(item)
                           if type(member) is dict or type(member) is list)


def _marker(item: dict[str, Any], path: Path) -> Found:
    def refuse(message: str) -> InvalidInput:
        return InvalidInput(f"a personal value is malformed: {message}", {where(path): message})

    inner = item[MARK]
    if len(item) != 1 or type(inner) is not dict:
        raise refuse(f'"{MARK}" must be the only key of its object, and hold an object')
    subject = inner.get("subject")
    if type(subject) is not str or not subject:
        raise refuse("a personal value names its data subject: a non-empty string")
    if len(subject) > SUBJECT_MAX_LENGTH:
        raise refuse(f"a subject id has at most {SUBJECT_MAX_LENGTH} characters")
    if not subject.isprintable():
        raise refuse("a subject id has no control characters")
    keys = inner.keys()
    if keys == _ENVELOPE_KEYS:
        sealed = inner["sealed"]
        if type(sealed) is not str or len(sealed) > SEALED_MAX_CHARS:
            raise refuse('"sealed" is the envelope the server gave, as it gave it')
        return Found(path, subject, sealed=sealed)
    if "value" not in keys or not keys <= _MARKER_KEYS:
        raise refuse('a personal value is {"subject", "value"} and optionally "lookup", '
                     'or an envelope {"subject", "sealed"} as the server gave it')
    lookup = inner.get("lookup", False)
    if type(lookup) is not bool:
        raise refuse('"lookup" is true or false')
    if personal_in_value(inner["value"]):
        raise refuse("a personal value holds no other personal value")
    return Found(path, subject, value=inner["value"], lookup=lookup)


def personal_in_value(value: Any) -> bool:
    """Whether ``value`` holds a marker or an envelope anywhere."""
    pending = [value]
    while pending:
        item = pending.pop()
        if type(item) is dict:
            if MARK in item:
                return True
            pending.extend(item.values())
        elif type(item) is list:
            pending.extend(item)
    return False


def replaced(value: Any, replace: Callable[[dict[str, Any], Path], Any], path: Path = ()) -> Any:
    """``value`` with every marker or envelope object replaced by ``replace(it, its path)`` (the
    paths ``personal_in`` names); a part with none is the same object, not a copy."""
    if type(value) is dict:
        if MARK in value:
            return replace(value, path)
        out = {key: replaced(member, replace, (*path, key)) for key, member in value.items()}
        return value if all(out[key] is value[key] for key in value) else out
    if type(value) is list:
        items = [replaced(member, replace, (*path, index)) for index, member in enumerate(value)]
        return value if all(new is old for new, old in zip(items, value, strict=True)) else items
    return value


# --- the cipher ----------------------------------------------------------------------------------


def _additional_data(namespace: str, subject: str) -> bytes:
    return json.dumps([namespace, subject]).encode()


def seal_value(data_key: bytes, *, namespace: str, subject: str, value: Any) -> str:
    """The base64url envelope text of ``value`` (its RFC 8785 bytes) under ``data_key``."""
    try:
        clear = canonical_json(value)
    except CanonicalizationError as exc:
        raise InvalidInput("a personal value cannot be represented as canonical JSON", {"value": str(exc)}) from None
    aad = _additional_data(namespace, subject)
    nonce = hmac.new(data_key[32:], aad + b"\x00" + clear, hashlib.sha256).digest()[:NONCE_BYTES]
    sealed = nonce + AESGCM(data_key[:32]).encrypt(nonce, clear, aad)
    return base64.urlsafe_b64encode(sealed).rstrip(b"=").decode()


def open_value(data_key: bytes, *, namespace: str, subject: str, sealed: str) -> Any:
    """The value of an envelope; ValueError when it is not one of this subject's."""
    try:
        raw = base64.urlsafe_b64decode(sealed + "=" * (-len(sealed) % 4))
        clear = AESGCM(data_key[:32]).decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:],
                                              _additional_data(namespace, subject))
    except (ValueError, InvalidTag) as exc:
        raise ValueError("not a sealed value of this subject") from exc
    return json.loads(clear)


def envelope(subject: str, sealed: str) -> dict[str, Any]:
    return {MARK: {"subject": subject, "sealed": sealed}}


def erased_marker(subject: str, erased_at: datetime) -> dict[str, Any]:
    """What shows in place of a value whose subject was erased."""
    return {MARK: {"subject": subject, "erased_at": format_timestamp(erased_at)}}


def lookup_digest(lookup_key: bytes, value: Any) -> bytes:
    """The blind index's keyed hash of a value (its RFC 8785 bytes)."""
    return hmac.new(lookup_key, canonical_json(value), hashlib.sha256).digest()


def _keys() -> KeyEncryptionKeys:
    try:
        return key_encryption_keys()
    except ImproperlyConfigured as exc:
        raise KeysUnavailable("personal data cannot be sealed or opened: no key-encryption key is configured "
                              "(docs/privacy.md)", {}) from exc


def data_key_wrap(key: bytes) -> tuple[str, bytes]:
    return _keys().wrap(key)


def data_key_unwrap(kek_id: str, wrapped: bytes | memoryview) -> bytes:
    try:
        return _keys().unwrap(kek_id, bytes(wrapped))
    except KeyUnavailable as exc:
        raise KeysUnavailable("personal data cannot be sealed or opened now: the server's key-encryption keys "
                              "do not open a data subject's key (see its log)", {}) from exc


# --- the statements, written once for both drivers ---------------------------------------------------

@dataclass(frozen=True)
class Statement:
    sql: str
    params: list[Any] | dict[str, Any]


Steps = Generator[Statement, list[tuple[Any, ...]], Any]

_SUBJECTS_SQL = """
SELECT id, subject, kek_id, wrapped_key, erased_at FROM backplane_datasubject
WHERE namespace = %(namespace)s AND subject = ANY(%(subjects)s)
"""
# The subjects' rows, and a new row for each subject offered a key that has none: one statement
# whether or not any is new (a write that inserts nothing commits nothing). Its snapshot does not
# see the rows it inserts, so the two halves never name one subject twice; a row a concurrent
# write inserted first is in neither (``raced``). In subject order, so two writes making the same
# subjects never wait on each other in a circle.
_SUBJECTS_MADE_SQL = """
WITH inserted AS (
    INSERT INTO backplane_datasubject (namespace, subject, kek_id, wrapped_key, created_at, erased_by, erase_reason)
    SELECT %(namespace)s::text, o.subject, %(kek_id)s::text, o.wrapped, %(now)s::timestamptz, '', ''
    FROM unnest(%(offered)s::text[], %(wrapped)s::bytea[]) AS o(subject, wrapped)
    WHERE NOT EXISTS (SELECT 1 FROM backplane_datasubject d
                      WHERE d.namespace = %(namespace)s::text AND d.subject = o.subject)
    ORDER BY o.subject
    ON CONFLICT (namespace, subject) DO NOTHING
    RETURNING id, subject, kek_id, wrapped_key, erased_at
)
SELECT id, subject, kek_id, wrapped_key, erased_at FROM inserted
UNION ALL
SELECT id, subject, kek_id, wrapped_key, erased_at FROM backplane_datasubject
WHERE namespace = %(namespace)s::text AND subject = ANY(%(subjects)s::text[])
"""
_LOOKUP_KEY_SQL = "SELECT kek_id, wrapped_key FROM backplane_lookupkey WHERE namespace = %s"
_LOOKUP_KEY_INSERT_SQL = """
INSERT INTO backplane_lookupkey (namespace, kek_id, wrapped_key, created_at) VALUES (%s, %s, %s, %s)
ON CONFLICT (namespace) DO NOTHING
"""
_LOOKUPS_INSERT_SQL = """
INSERT INTO backplane_personallookup (subject_id, digest)
SELECT l.subject_id, l.digest FROM unnest(%s::bigint[], %s::bytea[]) AS l(subject_id, digest)
ON CONFLICT (digest, subject_id) DO NOTHING
"""


@dataclass(frozen=True)
class SubjectRow:
    id: int
    subject: str
    kek_id: str | None
    wrapped_key: bytes | None
    erased_at: datetime | None


def _subject_rows(rows: Iterable[tuple[Any, ...]]) -> dict[str, SubjectRow]:
    return {row[1]: SubjectRow(*row) for row in rows}


def _seal_steps(namespace: str, body: Any, found: list[Found], now: datetime) -> Steps:
    """Seal ``found`` (of ``body``): the subjects' keys read, and made for new subjects; the
    lookups written; the body with envelopes in place of the values."""
    subjects = sorted({item.subject for item in found})
    # A key is offered to each subject of a clear value, made here whether it is needed or not (a
    # few microseconds) so that the read and the making are one statement; a subject named only by
    # envelopes is never made: an envelope of an unknown subject is refused below.
    offered = sorted({item.subject for item in found if item.sealed is None})
    wrapped = [data_key_wrap(secrets.token_bytes(DATA_KEY_BYTES)) for _ in offered]
    rows = _subject_rows((yield Statement(_SUBJECTS_MADE_SQL, {
        "namespace": namespace, "subjects": subjects, "offered": offered, "wrapped": [w for _, w in wrapped],
        "kek_id": wrapped[0][0] if wrapped else None, "now": now})))
    raced = [subject for subject in subjects if subject not in rows]
    if raced:
        # Made by a concurrent write first (or an envelope's unknown subject): a new statement sees it.
        rows.update(_subject_rows((yield Statement(_SUBJECTS_SQL, {"namespace": namespace, "subjects": raced}))))
    keys = {row.subject: data_key_unwrap(row.kek_id, row.wrapped_key) for row in rows.values()
            if row.wrapped_key is not None and row.kek_id is not None}
    sealed_at: dict[Path, dict[str, Any]] = {}
    for item in found:
        key = keys.get(item.subject)
        if item.sealed is not None:
            # Passed on as read: it must be a sealed value of this namespace's subject, unless the
            # subject was erased (then it carries nothing that can still be read: kept as it is).
            if item.subject not in rows:
                raise InvalidInput("an envelope of no data subject of this namespace",
                                   {where(item.path): "not a sealed value of this namespace"})
            if key is not None:
                try:
                    open_value(key, namespace=namespace, subject=item.subject, sealed=item.sealed)
                except ValueError:
                    raise InvalidInput("an envelope that is not a sealed value of this namespace's subject",
                                       {where(item.path): "not a sealed value of this subject"}) from None
            sealed_at[item.path] = envelope(item.subject, item.sealed)
        elif key is None:
            erased_at = rows[item.subject].erased_at
            raise SubjectErased(f"data subject {item.subject!r} was erased; its data is no longer taken",
                                {where(item.path): "subject erased",
                                 "erased_at": format_timestamp(erased_at) if erased_at else None})
        else:
            sealed_at[item.path] = envelope(item.subject, seal_value(key, namespace=namespace, subject=item.subject,
                                                                     value=item.value))
    lookups = [item for item in found if item.lookup]
    if lookups:
        lookup_key = yield from _lookup_key_steps(namespace, now)
        yield Statement(_LOOKUPS_INSERT_SQL, [[rows[item.subject].id for item in lookups],
                                              [lookup_digest(lookup_key, item.value) for item in lookups]])
    return replaced(body, lambda _marker, path: sealed_at[path])


def _lookup_key_steps(namespace: str, now: datetime) -> Steps:
    row = next(iter((yield Statement(_LOOKUP_KEY_SQL, [namespace]))), None)
    if row is None:
        kek_id, wrapped = data_key_wrap(secrets.token_bytes(32))
        yield Statement(_LOOKUP_KEY_INSERT_SQL, [namespace, kek_id, wrapped, now])
        row = next(iter((yield Statement(_LOOKUP_KEY_SQL, [namespace]))))
    return data_key_unwrap(row[0], row[1])


# --- the drivers ----------------------------------------------------------------------------------


def _run(steps: Steps) -> Any:
    """Run ``steps`` on Django's connection (each statement its own, in autocommit)."""
    with connection.cursor() as cursor:
        try:
            statement = next(steps)
            while True:
                cursor.execute(statement.sql, statement.params)
                statement = steps.send(cursor.fetchall() if cursor.description is not None else [])
        except StopIteration as done:
            return done.value


async def _run_async(conn: psycopg.AsyncConnection[Any], steps: Steps) -> Any:
    """Run ``steps`` on ``conn`` (in autocommit)."""
    try:
        statement = next(steps)
        while True:
            cursor = await conn.execute(statement.sql, statement.params)
            statement = steps.send(await cursor.fetchall() if cursor.description is not None else [])
    except StopIteration as done:
        return done.value


def _checked_namespace(namespace: str | None) -> str:
    if namespace is None:
        raise InvalidInput("personal values are marked by an agent, or a person, of one namespace",
                           {"namespace": "a caller of one namespace marks personal values"})
    return namespace


def seal_personal(namespace: str | None, body: Any) -> Any:
    """``body`` with its personal values sealed; ``body`` itself when it marks none. Before the
    write's transaction: a subject's key made for a write that then fails holds no data."""
    found = personal_in(body)
    if not found:
        return body
    return _run(_seal_steps(_checked_namespace(namespace), body, found, timezone.now()))


async def seal_personal_async(conn: psycopg.AsyncConnection[Any], namespace: str | None, body: Any) -> Any:
    """``seal_personal`` on the event loop's connection (in autocommit)."""
    found = personal_in(body)
    if not found:
        return body
    return await _run_async(conn, _seal_steps(_checked_namespace(namespace), body, found, timezone.now()))
