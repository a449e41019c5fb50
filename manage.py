#!/usr/bin/env python
"""Django's command-line utility for administrative tasks.

From a checkout where ``make run`` has been used (``var/`` exists), commands run with the
development settings and find the embedded database through ``var/database_url``, so
``.venv/bin/python manage.py create_agent …`` works as the docs print it. Anywhere else, and
whenever ``BACKPLANE_ENV`` is set, the settings are what the environment says: production
still refuses to start without its variables.
"""

import os
import sys
from pathlib import Path


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backplane.settings")
    var_dir = Path(os.environ.get("BACKPLANE_VAR_DIR", Path(__file__).resolve().parent / "var"))
    if "BACKPLANE_ENV" not in os.environ and var_dir.is_dir():
        os.environ["BACKPLANE_ENV"] = "development"
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
