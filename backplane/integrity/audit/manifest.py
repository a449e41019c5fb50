"""The audit segment format, shared by the exporter and the offline verifier (no Django here).

A segment ``N`` is two objects in the destination:

- ``segment-NNNNNNNN.jsonl``: the events of leaves ``first_leaf..last_leaf`` in leaf order, one
  per line, each the API's Event object (``backplane.chain.event_as_api_dict``) as RFC 8785
  canonical JSON, so its ``hash`` can be recomputed by docs/api.md's rule.
- ``segment-NNNNNNNN.manifest.json``: a JSON object with

  ``format``, ``segment`` (N, from 1), ``first_leaf``, ``last_leaf``, ``tree_size``
  (= last_leaf + 1), ``events``, ``root_hash`` (the tree of ``tree_size`` leaves),
  ``signed_tree_head`` (the sealer's head of that size as the API returns it: tree_size,
  root_hash, signed_at, signature, public_key), ``segment_file``, ``segment_sha256`` (of the
  .jsonl file's bytes), ``previous_manifest_sha256`` (of segment N-1's manifest file's bytes;
  64 zeros for segment 1), ``public_key`` and ``signature``: Ed25519, by the sealer's key, over
  the RFC 8785 canonical JSON of every other field.

Segments end at signed tree head sizes and follow each other without gap, so the verifier
rebuilds the whole tree from leaf 0 and meets every segment's signed root on the way.
"""

from __future__ import annotations

import json
import re
from typing import Any

from backplane.eventlog.canonical import canonical_json
from backplane.eventlog.chain import GENESIS_HASH

FORMAT = "backplane-audit-segment/1"
FIRST_PREVIOUS_MANIFEST_SHA256 = GENESIS_HASH

_MANIFEST_NAME = re.compile(r"^segment-(\d{8,})\.manifest\.json$")
_SEGMENT_NAME = re.compile(r"^segment-(\d{8,})\.jsonl$")


def segment_name(number: int) -> str:
    return f"segment-{number:08d}.jsonl"


def manifest_name(number: int) -> str:
    return f"segment-{number:08d}.manifest.json"


def manifest_number(name: str) -> int | None:
    match = _MANIFEST_NAME.match(name)
    return int(match.group(1)) if match else None


def segment_number(name: str) -> int | None:
    match = _SEGMENT_NAME.match(name)
    return int(match.group(1)) if match else None


def event_line(api_event: dict[str, Any]) -> bytes:
    return canonical_json(api_event) + b"\n"


def manifest_message(manifest: dict[str, Any]) -> bytes:
    """What a manifest's signature covers: every field but the signature, canonicalised."""
    return canonical_json({key: value for key, value in manifest.items() if key != "signature"})


def encode_manifest(manifest: dict[str, Any]) -> bytes:
    """The manifest file: indented for people, and deterministic (sorted keys), so that an export
    repeated after a crash produces the same bytes (Ed25519 signatures are deterministic too)."""
    return (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()


def tree_head_message(*, tree_size: int, root_hash: str, signed_at: str) -> bytes:
    """What a signed tree head's signature covers (docs/api.md, "Integrity"); the same bytes as
    ``backplane.sealing.tree_head_message``, which needs Django and so cannot be imported here."""
    return canonical_json({"tree_size": tree_size, "root_hash": root_hash, "signed_at": signed_at})
