"""An event's inclusion-proof bundle, and its offline check.

The bundle is one JSON file a person can download from the dashboard and hand to anyone:
the event as the API shows it, its leaf index and RFC 6962 audit path, and the signed tree
head the path leads to. ``python -m backplane.integrity.audit check-proof FILE --public-key KEY``
checks it with no database (this module imports neither Django nor psycopg):

1. the event's hash, recomputed from its content (RFC 8785 + SHA-256), is its ``hash``;
2. that hash, as a leaf (SHA-256(0x00 ‖ hash)), with the audit path gives the head's root;
3. the head is signed by the trusted key.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from backplane.integrity import merkle
from backplane.integrity.audit import manifest as fmt
from backplane.integrity.independent_hash import NotCanonicalizable, api_event_hash

BUNDLE_FORMAT = "backplane-inclusion-proof/1"


class ProofProblem(Exception):
    """What in the bundle does not check out."""


def _signed_by(head: dict[str, Any], public_keys: Collection[str]) -> str | None:
    if not isinstance(head.get("signature"), str) or not {"tree_size", "root_hash", "signed_at"} <= head.keys():
        return None
    message = fmt.tree_head_message(tree_size=head["tree_size"], root_hash=head["root_hash"],
                                    signed_at=head["signed_at"])
    for key in public_keys:
        try:
            Ed25519PublicKey.from_public_bytes(bytes.fromhex(key)).verify(bytes.fromhex(head["signature"]), message)
        except (InvalidSignature, ValueError):
            continue
        return key
    return None


def check_proof_bundle(bundle: Any, *, public_keys: Collection[str]) -> str:
    """Raise ``ProofProblem`` naming the first thing that fails; return a one-line summary."""
    try:
        if bundle.get("format") != BUNDLE_FORMAT:
            raise ProofProblem(f"not a {BUNDLE_FORMAT} file")
        event, head = bundle["event"], bundle["tree_head"]
        index, size, path = bundle["leaf_index"], bundle["tree_size"], bundle["audit_path"]
        recomputed = api_event_hash(event)
    except (AttributeError, KeyError, TypeError) as exc:
        raise ProofProblem(f"the bundle lacks {exc}") from None
    except NotCanonicalizable as exc:
        raise ProofProblem(f"the event cannot be canonicalised: {exc}") from None
    if not isinstance(head, dict):
        raise ProofProblem("the bundle lacks a tree_head object")
    if recomputed != event.get("hash"):
        raise ProofProblem(f"the event's content hashes to {recomputed}, not its recorded hash {event.get('hash')}")
    if size != head.get("tree_size"):
        raise ProofProblem(f"the proof is for tree size {size} but the head is of size {head.get('tree_size')}")
    try:
        proof = [merkle.hash_from_hex(item) for item in path]
        root = merkle.hash_from_hex(head["root_hash"])
    except (ValueError, TypeError, KeyError) as exc:
        raise ProofProblem(f"malformed hash in the bundle: {exc}") from None
    if not merkle.verify_inclusion(merkle.event_leaf_hash(recomputed), index, size, proof, root):
        raise ProofProblem(f"the audit path does not lead from leaf {index} to the root {head['root_hash']}")
    key = _signed_by(head, public_keys)
    if key is None:
        raise ProofProblem("the tree head is not signed by a trusted key")
    return (f"OK: event {event['task_id']}#{event['seq']} (hash {recomputed[:16]}…) is leaf {index} of the "
            f"tree of {size} signed at {head['signed_at']} by {key[:16]}…")
