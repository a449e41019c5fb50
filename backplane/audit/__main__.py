"""``python -m backplane.audit verify PATH_OR_S3_URL --public-key KEY`` (see ``verify.py``)."""

from backplane.audit.verify import main

raise SystemExit(main())
