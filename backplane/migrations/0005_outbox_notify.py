"""Wake long-running relays (``manage.py relay``) when outbox rows commit.

NOTIFY is delivered at commit, so a listener never wakes for a row it cannot see yet;
one notification per statement (not per row) keeps big batches cheap.
"""

from django.db import migrations

FORWARD = r"""
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

BACKWARD = r"""
DROP TRIGGER IF EXISTS backplane_outbox_notify_on_insert ON backplane_outboxmessage;
DROP FUNCTION IF EXISTS backplane_outbox_notify();
"""


class Migration(migrations.Migration):
    dependencies = [("backplane", "0004_outbox_webhooks_dead_letters")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
