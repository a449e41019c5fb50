"""The API fixtures (agents with real tokens) are shared with the event log's tests."""

from tests.api.conftest import alice, counts, make_agent, mallory  # noqa: F401 - pytest fixtures
from tests.backplane.integrity.audit_support import (  # noqa: F401 - pytest fixtures
    audit_dir,
    exported,
    public_key,
    s3_endpoint,
)
