"""System checks of the integrity part (registered in backplane/apps.py)."""

from __future__ import annotations

from typing import Any

from django.core.checks import Error
from django.core.exceptions import ImproperlyConfigured


def check_signing_key(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """Production needs BACKPLANE_SIGNING_KEY: without it nothing is sealed or exported.
    ``manage.py migrate`` runs the checks, so a deployment's migrate job stops here."""
    from backplane.integrity.sealing import require_signing_key

    try:
        require_signing_key()
    except ImproperlyConfigured as exc:
        return [Error(str(exc), id="backplane.E001",
                      hint="Set it to 64 hex digits (an Ed25519 seed), e.g. `python -c \"import secrets; "
                           "print(secrets.token_hex(32))\"`, and keep it: see docs/production.md, \"Keys\".")]
    return []
