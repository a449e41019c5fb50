"""Personal data in the log (docs/privacy.md): a data key per data subject, wrapped by a
key-encryption key; erasing a subject destroys its key, so every value sealed with it is gone
wherever a copy lies (the log, the audit exports, backups) while every hashed byte stays."""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.db import models

from backplane.eventlog.models import NAME_VALIDATOR

SUBJECT_MAX_LENGTH = 200
OPEN_PERSONAL_DATA_PERMISSION = "backplane.open_personal_data"
ERASE_SUBJECT_PERMISSION = "backplane.erase_subject"


class DataSubject(models.Model):
    """One data subject of one namespace and its data key (AES-256-GCM, 64 bytes: the cipher's
    key, then the key of the synthetic nonces), wrapped with a key-encryption key (keys.py).

    Erasure clears ``wrapped_key`` and ``kek_id`` and says who, why and when: the row itself is
    the ``SubjectErased`` record, kept so that a second erasure, and a write for the subject,
    are refused."""

    namespace = models.CharField(max_length=100, validators=[NAME_VALIDATOR])
    subject = models.CharField(max_length=SUBJECT_MAX_LENGTH)
    kek_id = models.CharField(max_length=64, null=True, blank=True)
    wrapped_key = models.BinaryField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField()
    erased_at = models.DateTimeField(null=True, blank=True)
    erased_by = models.CharField(max_length=200, blank=True, default="")
    erase_reason = models.TextField(blank=True, default="")

    class Meta:
        permissions = [
            ("open_personal_data", "Can read personal data in clear"),
            ("erase_subject", "Can erase a data subject"),
        ]
        constraints = [
            models.UniqueConstraint(fields=["namespace", "subject"], name="data_subject_unique"),
            # A live subject has its key; an erased one has none, and says when.
            models.CheckConstraint(
                condition=(models.Q(erased_at__isnull=True, wrapped_key__isnull=False, kek_id__isnull=False)
                           | models.Q(erased_at__isnull=False, wrapped_key__isnull=True, kek_id__isnull=True)),
                name="data_subject_key_or_erased",
            ),
        ]
        indexes = [models.Index(fields=["kek_id"], name="data_subject_kek_idx")]

    def __str__(self) -> str:
        return f"{self.namespace}/{self.subject}"


class LookupKey(models.Model):
    """A namespace's key for the blind index (``PersonalLookup``), wrapped like a subject's."""

    namespace = models.CharField(max_length=100, unique=True, validators=[NAME_VALIDATOR])
    kek_id = models.CharField(max_length=64)
    wrapped_key = models.BinaryField(editable=False)
    created_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"lookup key of {self.namespace}"


class PersonalLookup(models.Model):
    """A blind index entry: the keyed hash of a value a client marked ``lookup``, and its subject.
    Outside every hash, so erasure deletes it with the subject's key."""

    subject = models.ForeignKey(DataSubject, on_delete=models.CASCADE, related_name="lookups")
    digest = models.BinaryField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["digest", "subject"], name="personal_lookup_unique")]

    def __str__(self) -> str:
        return f"lookup of {self.subject_id}"


class PersonalDataRead(models.Model):
    """A person read personal data in clear: who, which subjects of which namespace, where."""

    read_at = models.DateTimeField()
    reader = models.CharField(max_length=200)
    namespace = models.CharField(max_length=100)
    subjects = ArrayField(models.CharField(max_length=SUBJECT_MAX_LENGTH))
    where = models.CharField(max_length=200)
    task_id = models.UUIDField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["namespace", "-read_at"], name="personal_read_recent_idx")]

    def __str__(self) -> str:
        return f"{self.reader} read {self.namespace}/{', '.join(self.subjects)}"
