"""Audit export and its offline verifier (docs/design.md, "Integrity and audit").

- ``export``: the service that writes sealed ranges as signed segments (needs Django and the database).
- ``verify``: ``python -m backplane.integrity.audit verify PATH_OR_S3_URL --public-key KEY``, which needs
  neither; ``format`` and ``storage`` are what both sides share.

Nothing is imported here, so the verifier never loads the Django side.
"""
