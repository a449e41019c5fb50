"""The ``backplane`` app's models, defined by the parts that own them.

Django finds an app's models through this module; the tables keep their ``backplane_*`` names
and their migrations stay in ``backplane/migrations``.
"""

from backplane.delivery.models import (
    DeadLetter,
    DeadLetterSource,
    DeadLetterStatus,
    OutboxDestination,
    OutboxMessage,
    OutboxStatus,
    WebhookSubscription,
)
from backplane.eventlog.models import (
    CLOSED_STATUSES,
    NAME_VALIDATOR,
    Agent,
    BreakerTransition,
    CostRollup,
    Event,
    IdempotentReplay,
    ModelPrice,
    Task,
    TaskStatus,
    hash_token,
)
from backplane.integrity.models import (
    AuditSegment,
    IntegrityAlert,
    MerkleLeaf,
    SignedTreeHead,
    VerificationMode,
    VerificationRun,
    VerifiedHead,
)
from backplane.privacy.models import DataSubject, LookupKey, PersonalDataRead, PersonalLookup
from backplane.runtime.models import Duty

__all__ = [
    "DataSubject",
    "LookupKey",
    "PersonalDataRead",
    "PersonalLookup",
    "Duty",
    "WebhookSubscription",
    "OutboxStatus",
    "OutboxDestination",
    "OutboxMessage",
    "DeadLetterSource",
    "DeadLetterStatus",
    "DeadLetter",
    "NAME_VALIDATOR",
    "hash_token",
    "Agent",
    "BreakerTransition",
    "TaskStatus",
    "CLOSED_STATUSES",
    "Task",
    "CostRollup",
    "Event",
    "ModelPrice",
    "IdempotentReplay",
    "VerificationMode",
    "VerificationRun",
    "VerifiedHead",
    "IntegrityAlert",
    "MerkleLeaf",
    "SignedTreeHead",
    "AuditSegment",
]
