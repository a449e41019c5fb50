"""kombu's filesystem transport, with messages written atomically and read in linear time.

The stock transport (kombu 5.7) creates each message file under its final name and then
writes it, while readers list the folder, move a file away and read it without taking the
writer's lock. A reader polling while another process publishes can take an empty file,
fail to decode it, and the message is gone (celery/kombu#1551). Writing under a temporary
name that no queue matches and renaming it into place (atomic on POSIX) means a reader only
ever sees complete files.

Every queue's messages share one folder, and the stock ``_get`` sorts the whole folder and then
pops names off the front of the list one by one until it finds its queue's: each poll costs the
square of the folder's size. The relay's messages for a queue nobody reads yet pile up there,
and the Celery worker, polling its own queue five times a second, spent more and more of its
CPU on them. Here a poll keeps its queue's names first and sorts only those.

Registered as the ``bpfilesystem://`` transport; the embedded broker (settings.CELERY_BROKER_URL)
uses it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from queue import Empty
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import TRANSPORT_ALIASES, filesystem
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

ALIAS = "bpfilesystem"


class Channel(filesystem.Channel):
    # kombu's own bases name the second parameter differently (AbstractChannel: message,
    # filesystem.Channel: payload), so no signature matches both; kombu passes it by position.
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        """Put ``payload`` onto ``queue``: write a hidden temporary file, then rename it into place."""
        # Zero-padded: readers sort names as text, so an unpadded millisecond count would put
        # 10000000_... before 9999999_... once the clock gains a digit (about 2.8 h of uptime).
        final = os.path.join(
            self.data_folder_out, f"{int(round(monotonic() * 1000)):015d}_{uuid.uuid4()}.{queue}.msg"
        )
        # Starts with a dot: ``_get`` matches files by the text after the first dot, which
        # for this name is never "<queue>.msg".
        temporary = os.path.join(self.data_folder_out, f".tmp-{uuid.uuid4().hex}")
        try:
            with open(temporary, "wb", buffering=0) as handle:
                handle.write(str_to_bytes(dumps(payload)))
            os.replace(temporary, final)
        except OSError as exc:
            try:
                os.unlink(temporary)
            except OSError:
                pass
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


    def _get(self, queue: str, timeout: float | None = None) -> Any:
        """The oldest message of ``queue``, as the stock ``_get`` takes it (moved away, read,
        removed); ``Empty`` when it has none."""
        wanted = f"{queue}.msg"
        names = sorted(name for name in os.listdir(self.data_folder_in) if name.partition(".")[2] == wanted)
        processed_folder = self.processed_folder if self.store_processed else tempfile.gettempdir()
        for name in names:
            try:
                shutil.move(os.path.join(self.data_folder_in, name), processed_folder)
            except OSError:
                continue  # another reader took it first
            taken = os.path.join(processed_folder, name)
            try:
                with open(taken, "rb") as handle:
                    payload = handle.read()
                if not self.store_processed:
                    os.remove(taken)
            except OSError as exc:
                raise ChannelError(f"Cannot read file {taken!r} from queue.") from exc
            return loads(bytes_to_str(payload))
        raise Empty()


class Transport(filesystem.Transport):
    Channel = Channel


def register() -> None:
    TRANSPORT_ALIASES.setdefault(ALIAS, "backplane.delivery.kombu_filesystem:Transport")
