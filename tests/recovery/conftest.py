"""The API fixtures (agents with real tokens, row counts) are shared with recovery's tests."""

from tests.api.conftest import alice, counts, make_agent, mallory  # noqa: F401 - pytest fixtures
