"""Whose file is whose in the metrics directory: one name per process, unique across hosts.

prometheus_client's multiprocess mode names each process's files by ``os.getpid()``. That is
unique on one machine only: containers that share one directory (docker-compose.yml's web,
worker and beat on one volume, so the web's ``/metrics`` sums all of them) each start their
pids from 1, and two processes writing one file would lose counts. The name here is the host
name (a container's id) and the pid. Imported by settings before anything else imports
prometheus_client, so no metric is ever made with the library's default.
"""

from __future__ import annotations

import os
import re
import socket

# prometheus_client splits file names on "_" (``<type>_<mode>_<process>.db``): keep it out.
_HOST = re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname()) or "host"


def metrics_process_name(pid: int | None = None) -> str:
    """The name this process's (or, given its pid, a child's on this host) files carry."""
    return f"{_HOST}-{os.getpid() if pid is None else pid}"


def metrics_process_files_install() -> None:
    """Make every metric made from now on write to files named by ``metrics_process_name``.
    Fork-safe as the library's default is: the name is asked again on every write, and a
    forked child (a Celery or uvicorn worker) that gets a new one opens files of its own."""
    from prometheus_client import values

    values.ValueClass = values.MultiProcessValue(process_identifier=metrics_process_name)
