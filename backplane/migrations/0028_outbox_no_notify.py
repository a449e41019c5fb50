"""Outbox inserts no longer NOTIFY (0005's trigger is dropped).

A NOTIFY takes PostgreSQL's one notification-queue lock at pre-commit and holds it until the
transaction's commit record is flushed, so every transaction that notifies commits one at a
time: with an outbox message per append, every append on the server queued behind every other
one's WAL flush. The relays find due rows by polling instead (``manage.py relay`` every
``--poll-seconds``, the beat task every second), which costs no write anything.
"""

from django.db import migrations

FORWARD = r"""
DROP TRIGGER IF EXISTS backplane_outbox_notify_on_insert ON backplane_outboxmessage;
DROP FUNCTION IF EXISTS backplane_outbox_notify();
"""

BACKWARD = r"""
CREATE FUNCTION backplane_outbox_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('backplane_outbox', '');
    RETURN NULL;
END
$$;

CREATE TRIGGER backplane_outbox_notify_on_insert
    AFTER INSERT ON backplane_outboxmessage
    FOR EACH STATEMENT EXECUTE FUNCTION backplane_outbox_notify();
"""


class Migration(migrations.Migration):
    dependencies = [("backplane", "0027_outbox_key_scope_subscription_namespaces")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
