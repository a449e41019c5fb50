"""Key-encryption keys (KEKs): what wraps every data subject's key (models.py).

The provider is named by ``BACKPLANE_KEK_PROVIDER`` (a dotted path to a ``KeyEncryptionKeys``
class); the default, ``FileKeys``, reads ``BACKPLANE_KEK_FILE``, a JSON file of named 256-bit
keys and the one new keys are wrapped with::

    {"current": "2026-12", "keys": {"2026-12": "<base64 of 32 bytes>", "2026-06": "…"}}

A KMS-style provider implements the same three methods with the KMS's wrap and unwrap calls.
Wrapping is AES key wrap (RFC 3394), whose integrity check makes a wrong key an error, never
silent garbage. Rotation (``kek_rotate``) adds a key, makes it current and re-wraps the subjects'
keys under it: no sealed value is touched. Keys are never logged, exported or put on /metrics:
nothing here formats one.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import secrets
import threading
from functools import lru_cache
from pathlib import Path
from typing import Protocol

from cryptography.hazmat.primitives.keywrap import InvalidUnwrap, aes_key_unwrap, aes_key_wrap
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

logger = logging.getLogger(__name__)

KEK_BYTES = 32


class KeyUnavailable(Exception):
    """A wrapped key that no key-encryption key of the provider opens: the KEK it names is
    missing, or is not the one that wrapped it."""


class KeyEncryptionKeys(Protocol):
    def current_id(self) -> str:
        """The KEK new keys are wrapped with."""

    def wrap(self, key: bytes) -> tuple[str, bytes]:
        """``key`` wrapped with the current KEK: (that KEK's id, the wrapped bytes)."""

    def unwrap(self, kek_id: str, wrapped: bytes) -> bytes:
        """The key ``wrapped`` with KEK ``kek_id``; ``KeyUnavailable`` when it cannot be opened."""


class FileKeys:
    """KEKs from a JSON file (the module's docstring). In development and tests a missing file is
    created with one new key; elsewhere a missing or malformed file is ImproperlyConfigured."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._current, self._keys = self._read()

    def _read(self) -> tuple[str, dict[str, bytes]]:
        if not self.path.exists() and settings.IS_LOCAL:
            kek_file_create(self.path)
        try:
            document = json.loads(self.path.read_text())
            keys = {str(name): base64.b64decode(value, validate=True) for name, value in document["keys"].items()}
            current = str(document["current"])
        except FileNotFoundError:
            raise ImproperlyConfigured(f"BACKPLANE_KEK_FILE {self.path} does not exist") from None
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ImproperlyConfigured(
                f"BACKPLANE_KEK_FILE {self.path} is not a key file "
                f'({{"current": id, "keys": {{id: base64 of {KEK_BYTES} bytes}}}}): {type(exc).__name__}') from None
        if current not in keys:
            raise ImproperlyConfigured(f"BACKPLANE_KEK_FILE {self.path}: the current key {current!r} is not in keys")
        for name, key in keys.items():
            if len(key) != KEK_BYTES:
                raise ImproperlyConfigured(f"BACKPLANE_KEK_FILE {self.path}: key {name!r} is not {KEK_BYTES} bytes")
        return current, keys

    def current_id(self) -> str:
        return self._current

    def wrap(self, key: bytes) -> tuple[str, bytes]:
        return self._current, aes_key_wrap(self._keys[self._current], key)

    def unwrap(self, kek_id: str, wrapped: bytes) -> bytes:
        kek = self._keys.get(kek_id)
        if kek is None:
            raise KeyUnavailable(f"no key-encryption key {kek_id!r} in {self.path}")
        try:
            return aes_key_unwrap(kek, wrapped)
        except InvalidUnwrap:
            raise KeyUnavailable(f"the key-encryption key {kek_id!r} in {self.path} is not the one that "
                                 "wrapped the subjects' keys") from None


def kek_file_create(path: Path, *, name: str = "k1") -> None:
    """A new key file holding one new key, readable by its owner only. Written whole beside it and
    linked into place, which fails if the file exists: of processes (or threads) starting at once,
    the first one's key is everybody's, and nobody reads half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
    staged.write_text(json.dumps({"current": name, "keys": {name: _new_kek()}}, indent=2) + "\n")
    staged.chmod(0o600)
    try:
        os.link(staged, path)
        logger.warning("no key-encryption key file: generated a development one in %s", path)
    except FileExistsError:
        pass
    finally:
        staged.unlink()


def kek_file_add(path: Path, name: str) -> None:
    """Add a new key named ``name`` to the key file and make it current (the first half of a
    rotation; ``kek_rotate`` is the second)."""
    document = json.loads(path.read_text())
    if name in document["keys"]:
        raise ValueError(f"the key file already holds a key named {name!r}")
    document["keys"][name] = _new_kek()
    document["current"] = name
    # Written beside and renamed over: a crash leaves the old file or the new, never half of one.
    staged = path.with_suffix(".new")
    staged.write_text(json.dumps(document, indent=2) + "\n")
    staged.chmod(0o600)
    staged.replace(path)


def _new_kek() -> str:
    return base64.b64encode(secrets.token_bytes(KEK_BYTES)).decode()


_PROVIDER_LOCK = threading.Lock()


def key_encryption_keys() -> KeyEncryptionKeys:
    """The configured provider, made once per process by the first thread that asks
    (``key_encryption_keys_forget`` after the key file changes)."""
    with _PROVIDER_LOCK:
        return _provider()


@lru_cache(maxsize=1)
def _provider() -> KeyEncryptionKeys:
    provider: type = import_string(settings.BACKPLANE_KEK_PROVIDER)
    if provider is FileKeys:
        if settings.BACKPLANE_KEK_FILE is None:
            raise ImproperlyConfigured("BACKPLANE_KEK_FILE must be set to seal personal data (docs/privacy.md)")
        return FileKeys(Path(settings.BACKPLANE_KEK_FILE))
    instance: KeyEncryptionKeys = provider()
    return instance



def key_encryption_keys_forget() -> None:
    """Read the provider anew at its next use (after the key file changed)."""
    with _PROVIDER_LOCK:
        _provider.cache_clear()
