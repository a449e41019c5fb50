"""Python CPU per API request, in one process, without a server or a load generator.

    .venv/bin/python bench/api_cpu.py [--requests 2000]

Calls the product's WSGI application directly (the same handler uvicorn reaches through
a2wsgi) with real agent tokens against a throw-away PostgreSQL, one request after another,
and reports wall time and this process's CPU time (``time.process_time``: the server-side
Python cost, without the database's own work) per request for:
  - GET of an unknown API path (the baseline: Django's handler and middleware, a resolver miss and
    the contract's JSON 404; no DRF, no database),
  - GET /api/v1/tasks/{id}/ (authentication, one SELECT; Django's path, which a staff session's
    read takes: an agent's is answered before Django, api/agent_front.py),
  - POST /api/v1/tasks/{id}/events/ (a single-event append),
  - GET /api/v1/tasks/{id}/events/ (a page of 100 events, per event too),
  - POST /api/v1/tasks/{id}/events/batch/ with 100 events (per event too).
On a shared 2-core machine this is the figure that bounds ``bench/api_append.py``: two cores
serve at most 2000 / (CPU ms per request) requests a second, before PostgreSQL and the clients
take their share.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from _support import bench_database


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON (bench/http_bench.py reads it)")
    args = parser.parse_args()
    os.environ["BACKPLANE_RATE_LIMIT"] = "1000000/s"
    os.environ["BACKPLANE_DB_POOL"] = "1"
    with bench_database():
        from django.core.wsgi import get_wsgi_application

        from backplane.eventlog import services

        app = get_wsgi_application()
        token = services.agent_create(name="cpu-bench", namespace="bench").token

        def call(method: str, path: str, body: object = None) -> tuple[str, bytes]:
            data = b"" if body is None else json.dumps(body).encode()
            path, _, query = path.partition("?")
            environ = {
                "REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": query, "SERVER_NAME": "127.0.0.1",
                "SERVER_PORT": "80", "SERVER_PROTOCOL": "HTTP/1.1", "wsgi.url_scheme": "http",
                "wsgi.input": io.BytesIO(data), "wsgi.errors": sys.stderr, "CONTENT_LENGTH": str(len(data)),
                "CONTENT_TYPE": "application/json", "HTTP_AUTHORIZATION": f"Bearer {token}",
                "HTTP_HOST": "127.0.0.1",
            }
            status: list[str] = []
            answer = b"".join(app(environ, lambda s, headers: status.append(s)))
            return status[0], answer

        status, answer = call("POST", "/api/v1/tasks/", {"kind": "bench", "input": {}})
        task_id = json.loads(answer)["task_id"]
        counter = iter(range(10**9))

        def expect(prefix: str, result: tuple[str, bytes]) -> None:
            if not result[0].startswith(prefix):
                raise SystemExit(f"unexpected answer {result[0]}: {result[1][:300]!r}")

        def django_floor() -> None:
            expect("404", call("GET", "/api/v1/no-such-route/"))

        def task_detail() -> None:
            expect("200", call("GET", f"/api/v1/tasks/{task_id}/"))

        def events_page() -> None:
            expect("200", call("GET", f"/api/v1/tasks/{task_id}/events/?limit=100"))

        def append() -> None:
            body = {"type": "ReasoningStepCompleted", "payload": {"step": next(counter), "thought": "bench"}}
            expect("201", call("POST", f"/api/v1/tasks/{task_id}/events/", body))

        def batch() -> None:
            events = [{"type": "ReasoningStepCompleted", "payload": {"step": next(counter), "thought": "bench"}}
                      for _ in range(100)]
            expect("201", call("POST", f"/api/v1/tasks/{task_id}/events/batch/", {"events": events}))

        def measure(run: Callable[[], None], count: int) -> tuple[float, float]:
            for _ in range(max(10, count // 10)):  # warm-up
                run()
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(count):
                run()
            return (time.perf_counter() - wall) / count * 1000, (time.process_time() - cpu) / count * 1000

        print(f"api_cpu bench: {args.requests} requests per route, one after another, in this process "
              f"(load average {os.getloadavg()[0]:.1f})")
        base_wall, base_cpu = measure(django_floor, args.requests)
        print(f"  {'GET unknown path, 404 (baseline)':38s} wall {base_wall:6.2f} ms  "
              f"python cpu {base_cpu:6.2f} ms/request")
        results = {"django_floor": {"wall_ms": base_wall, "cpu_ms": base_cpu, "requests": args.requests}}
        for key, name, run, count, per in (
            ("task_detail", "GET /api/v1/tasks/{id}/", task_detail, args.requests, 1),
            ("append", "POST .../events/ (1 event)", append, args.requests, 1),
            # After the appends, so the page is full.
            ("events_page", "GET .../events/ (a page of 100)", events_page, max(20, args.requests // 10), 100),
            ("batch", "POST .../events/batch/ (100 events)", batch, max(20, args.requests // 20), 100),
        ):
            wall, cpu = measure(run, count)
            results[key] = {"wall_ms": wall, "cpu_ms": cpu, "requests": count, "events_per_request": per,
                            "cpu_ratio_to_django_floor": cpu / base_cpu}
            print(f"  {name:38s} wall {wall:6.2f} ms  python cpu {cpu:6.2f} ms/request, "
                  f"{cpu / per * 1000:7.0f} us/event, {cpu / base_cpu:5.1f} x the baseline; "
                  f"2 cores at most {2000 / cpu * per:,.0f} events/s")
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
