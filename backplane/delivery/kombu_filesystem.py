"""kombu's filesystem transport, with messages written atomically.

The stock transport (kombu 5.7) creates each message file under its final name and then
writes it, while readers list the folder, move a file away and read it without taking the
writer's lock. A reader polling while another process publishes can take an empty file,
fail to decode it, and the message is gone (celery/kombu#1551). Writing under a temporary
name that no queue matches and renaming it into place (atomic on POSIX) means a reader only
ever sees complete files. Registered as the ``bpfilesystem://`` transport; the embedded
broker (settings.CELERY_BROKER_URL) uses it.
"""

from __future__ import annotations

import os
import uuid
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import TRANSPORT_ALIASES, filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

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


class Transport(filesystem.Transport):
    Channel = Channel


def register() -> None:
    TRANSPORT_ALIASES.setdefault(ALIAS, "backplane.delivery.kombu_filesystem:Transport")
