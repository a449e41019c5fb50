"""Make the event table append-only inside PostgreSQL itself.

The ORM never updates or deletes events, but the guarantee must also hold for raw SQL,
other clients and mistakes. Row triggers reject UPDATE and DELETE; a statement trigger
rejects TRUNCATE of a table that holds rows (truncating an empty table destroys nothing,
and the test suite's cleanup relies on that after emptying the table as a superuser
with ``session_replication_role = replica``, which skips triggers).
"""

from django.db import migrations

FORWARD = r"""
CREATE FUNCTION backplane_event_reject_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'backplane_event is append-only: % is not allowed', TG_OP
        USING ERRCODE = 'restrict_violation',
              HINT = 'events are immutable; append a new event instead';
END
$$;

CREATE FUNCTION backplane_event_reject_truncate() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM backplane_event) THEN
        RAISE EXCEPTION 'backplane_event is append-only: TRUNCATE is not allowed'
            USING ERRCODE = 'restrict_violation',
                  HINT = 'events are immutable; append a new event instead';
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER backplane_event_no_update_or_delete
    BEFORE UPDATE OR DELETE ON backplane_event
    FOR EACH ROW EXECUTE FUNCTION backplane_event_reject_change();

CREATE TRIGGER backplane_event_no_truncate
    BEFORE TRUNCATE ON backplane_event
    FOR EACH STATEMENT EXECUTE FUNCTION backplane_event_reject_truncate();
"""

BACKWARD = r"""
DROP TRIGGER IF EXISTS backplane_event_no_truncate ON backplane_event;
DROP TRIGGER IF EXISTS backplane_event_no_update_or_delete ON backplane_event;
DROP FUNCTION IF EXISTS backplane_event_reject_truncate();
DROP FUNCTION IF EXISTS backplane_event_reject_change();
"""


class Migration(migrations.Migration):
    dependencies = [("backplane", "0001_initial")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
