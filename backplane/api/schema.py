"""OpenAPI post-processing: say in the schema what the serializers enforce."""

from __future__ import annotations

from typing import Any


def forbid_unknown_request_fields(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """Request bodies refuse unknown fields (StrictSerializer), so the schema says
    ``additionalProperties: false`` for them; response objects stay open for additions."""
    for name, component in result.get("components", {}).get("schemas", {}).items():
        if name.endswith("Request") and component.get("type") == "object":
            component["additionalProperties"] = False
    return result
