"""Reads of the dashboard, one module per page or group of pages: ``overview``, ``tasks`` (the
list), ``task_detail``, ``diff``, ``outbox`` and ``spend`` (model spend, on the overview, a
task's page and the agents page). Callers import the module they read from; the words the
pages show are written in dashboard/text.py.

Every function here runs a fixed number of queries whatever the number of rows (the tests
hold them to it with ``django_assert_max_num_queries``; ``diff.drift_page`` reads two whole
histories, one query per range of up to 5,000 events), and none counts or offsets through
a whole table: lists are keyset-paginated, time windows go through the BRIN index on
``recorded_at``, payload search through the GIN index over the payloads' words (migration
``backplane.0011``).

Raw SQL here takes its connection from ``reads_connection()``, as the ORM's reads take theirs from
the router: the read replica on the pages that opt in with ``replica_reads``, the primary
everywhere else (backplane/runtime/replica.py).
"""
