"""Where audit segments live: a directory or an S3 bucket with Object Lock.

Shared by the exporter and the offline verifier, so it imports nothing from Django (and boto3
only when an S3 location is used). Objects are write-once: the exporter never replaces one,
it only writes what is missing (see ``backplane/integrity/audit/export.py`` on crashes).
Every failure surfaces as an ``OSError`` (S3 errors as ``StoreError``), so callers handle one
family of exceptions whatever the destination.
"""

from __future__ import annotations

import base64
import hashlib
import os
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit


class StoreError(OSError):
    """The destination could not be read or written (network, permissions, missing bucket...)."""


class Store(Protocol):
    url: str

    def names(self) -> list[str]:
        """The object names directly in this location, sorted."""
        ...

    def read(self, name: str) -> bytes | None:
        """An object's bytes, or None when it does not exist."""
        ...

    def write_once(self, name: str, data: bytes) -> None:
        """Create an object that must not exist yet, made read-only / retention-locked."""
        ...


class DirectoryStore:
    """Files in one directory, made read-only (0o444) once written."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.url = self.path.resolve().as_uri()

    def names(self) -> list[str]:
        return sorted(entry.name for entry in self.path.iterdir() if entry.is_file())

    def read(self, name: str) -> bytes | None:
        try:
            return (self.path / name).read_bytes()
        except FileNotFoundError:
            return None

    def write_once(self, name: str, data: bytes) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        temporary = self.path / f".{name}.{uuid.uuid4().hex}.tmp"
        # 1. The whole content goes to a temporary name and reaches the disk, so the final name
        #    never shows a partial file, even after a power cut.
        with open(temporary, "xb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            # 2. Read-only before it gets its name: there is no moment where it is writable there.
            temporary.chmod(0o444)
            # 3. link() rather than rename(): it fails if the name exists, so nothing is replaced.
            os.link(temporary, self.path / name)
        finally:
            temporary.unlink(missing_ok=True)
        directory = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(directory)  # the new name itself survives a crash
        finally:
            os.close(directory)


def normalize_prefix(prefix: str) -> str:
    """``a/b`` and ``/a/b/`` both mean the "folder" ``a/b/``; empty means the bucket's top."""
    prefix = prefix.strip("/")
    return f"{prefix}/" if prefix else ""


class S3Store:
    """Objects under a prefix of a bucket. Writes use Object Lock in COMPLIANCE mode: until the
    retain-until date nobody, the account's root user included, can delete or change them."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        retention_days: int | None = None,
        client: Any = None,
    ) -> None:
        self.bucket = bucket
        self.prefix = normalize_prefix(prefix)
        self.retention_days = retention_days
        self.url = f"s3://{bucket}/{self.prefix}"
        if client is None:
            import boto3
            from botocore.config import Config

            # Few retries inside botocore: the export task retries with its own backoff, and the
            # verifier should fail fast on a wrong endpoint.
            config = Config(retries={"max_attempts": 2, "mode": "standard"}, connect_timeout=10, read_timeout=60)
            client = boto3.client("s3", endpoint_url=endpoint_url or None, region_name=region or None, config=config)
        self.client = client

    def _call(self, operation: str, **kwargs: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return getattr(self.client, operation)(Bucket=self.bucket, **kwargs)
        except ClientError as exc:
            raise StoreError(f"S3 {operation} on {self.url}: {exc}") from exc
        except BotoCoreError as exc:
            raise StoreError(f"S3 {operation} on {self.url}: {exc}") from exc

    def names(self) -> list[str]:
        names = []
        token: dict[str, str] = {}
        while True:
            page = self._call("list_objects_v2", Prefix=self.prefix, **token)
            for item in page.get("Contents", []):
                name = item["Key"][len(self.prefix):]
                if name and "/" not in name:
                    names.append(name)
            if not page.get("IsTruncated"):
                return sorted(names)
            token = {"ContinuationToken": page["NextContinuationToken"]}

    def read(self, name: str) -> bytes | None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self.prefix + name)
            body: bytes = response["Body"].read()
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in {"NoSuchKey", "404"}:
                return None
            raise StoreError(f"S3 get_object {self.url}{name}: {exc}") from exc
        except BotoCoreError as exc:
            raise StoreError(f"S3 get_object {self.url}{name}: {exc}") from exc
        return body

    def write_once(self, name: str, data: bytes) -> None:
        if self.retention_days is None:
            raise StoreError(f"{self.url} was opened for reading only (no retention period)")
        retain_until = datetime.now(UTC) + timedelta(days=self.retention_days)
        # Object Lock requires an integrity header on PutObject; Content-MD5 is the one every
        # S3-compatible server accepts.
        self._call(
            "put_object",
            Key=self.prefix + name,
            Body=data,
            ContentMD5=base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode(),
            ContentType="application/json" if name.endswith(".json") else "application/x-ndjson",
            ObjectLockMode="COMPLIANCE",
            ObjectLockRetainUntilDate=retain_until,
        )


def open_location(location: str, *, endpoint_url: str | None = None) -> Store:
    """A store for reading from a directory path, ``file://`` URL or ``s3://bucket/prefix``."""
    parts = urlsplit(location)
    if parts.scheme == "s3":
        if not parts.netloc:
            raise ValueError(f"{location!r} names no bucket (s3://bucket/prefix)")
        return S3Store(parts.netloc, unquote(parts.path), endpoint_url=endpoint_url)
    if parts.scheme == "file":
        return DirectoryStore(unquote(parts.path))
    if parts.scheme:
        raise ValueError(f"{location!r}: only a directory, file:// or s3:// is understood")
    return DirectoryStore(location)
