"""Personal values as a person sees them on a page (docs/privacy.md): ``[personal: lead:8812]``
for a sealed one, ``[erased: lead:8812, <when>]`` for one whose subject was erased, or, for a
privacy officer who asked, the value itself (a read recorded by the service)."""

from __future__ import annotations

import uuid
from typing import Any

from backplane.privacy.sealing import MARK, replaced
from backplane.privacy.services import personal_open, personal_shown


def _label(marker: dict[str, Any], _path: Any) -> str:
    inner = marker[MARK]
    if "erased_at" in inner:
        return f"[erased: {inner.get('subject')}, {inner['erased_at']}]"
    return f"[personal: {inner.get('subject')}]"


def personal_for_people(namespace: str, values: list[Any], *, reader: str | None = None,
                        task_id: uuid.UUID | None = None) -> list[Any]:
    """``values`` with their envelopes as a page shows them; ``reader``: the privacy officer who
    asked to see them opened (recorded once for all of ``values``). One query when any holds one."""
    if reader is not None:
        shown = personal_open(namespace, values, reader=reader, where_read="task page", task_id=task_id,
                              bounded=False).value
    else:
        shown = personal_shown(namespace, values)
    return [replaced(value, _label) for value in shown]
