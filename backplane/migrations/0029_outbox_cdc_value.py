"""The function that computes an outbox row as the CDC relay publishes it (docs/delivery.md,
"Change data capture").

Debezium's outbox router publishes one column of a new row as the Kafka record's value. So that a
consumer reads the same envelope whichever relay published it (``relay.envelope``: ``message_id``,
``topic``, ``key``, ``payload``, ``headers`` with ``attempt``), ``manage.py cdc setup`` adds a stored
generated column computed by this function, which logical decoding sends along. Only then: the
column stores each message a second time, which the polling relay has no use for
(tests/api/test_storage_bounds.py holds the default install to its bound), and ``cdc teardown``
drops it again.

jsonb_build_object is STABLE only because some types' text forms depend on settings; for the uuid,
text and jsonb it is given here the result never does, so the wrapper may be IMMUTABLE, as a
generated column requires.
"""

from django.db import migrations

FORWARD = r"""
CREATE FUNCTION backplane_outbox_envelope(message_id uuid, topic text, key text, payload jsonb, headers jsonb)
RETURNS jsonb LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN jsonb_build_object('message_id', message_id, 'topic', topic, 'key', key, 'payload', payload,
                          'headers', headers || '{"attempt": 1}'::jsonb);
"""

BACKWARD = r"""
ALTER TABLE backplane_outboxmessage DROP COLUMN IF EXISTS cdc_value;
DROP FUNCTION backplane_outbox_envelope(uuid, text, text, jsonb, jsonb);
"""


class Migration(migrations.Migration):
    dependencies = [("backplane", "0028_outbox_no_notify")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
