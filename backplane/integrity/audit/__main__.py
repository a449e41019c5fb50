"""``python -m backplane.integrity.audit verify PATH_OR_S3_URL --public-key KEY`` (see ``verify.py``)."""

from backplane.integrity.audit.verify import main

raise SystemExit(main())
