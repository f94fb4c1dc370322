"""The one place where a refused batch becomes its typed error: a guard statement fails its
transaction on purpose (a NOT NULL or UNIQUE constraint of one of the queue's own tables, each
guard its own), and the text of that failure names which guard it was. Each family keeps its
guards' texts beside their statements; the backend asks `refined` what an error stands for,
then the plan what to do instead (`Plan.instead`)."""

from __future__ import annotations

from ..errors import BatchDone, QueueError, QueueFull, TenantMismatch
from . import publish, rounds
from .batch_joins import BATCH_DONE_ERROR
from .core import QueueCore
from .schema import FENCE_ERROR, SchemaChanged, changed
from .tenants import TenantsTurnedOn


def refined(core: QueueCore, error: QueueError) -> QueueError:
    """The typed error a failed batch stands for (a guard statement's refusal), or `error`
    itself."""
    text, n = str(error), core.names
    if FENCE_ERROR.format(meta=n.meta) in text:
        return SchemaChanged(changed(core, None))
    if publish.QUEUE_FULL_ERROR.format(tenants=n.tenants) in text:
        return QueueFull(publish.FULL)
    if (
        rounds.TENANTS_ON_ERROR.format(claims=n.claims) in text
        or publish.TENANTS_ON_ERROR.format(messages=n.messages) in text
    ):
        return TenantsTurnedOn(text)
    if BATCH_DONE_ERROR.format(batch_sources=n.batch_sources) in text:
        return BatchDone(
            "this write names a batch that is done (its callbacks were published), or that "
            "this queue does not know: nothing was written"
        )
    if publish.TENANT_CHANGE_ERROR.format(tenants=n.tenants) in text:
        return TenantMismatch(
            "a group's tenant never changes while it has messages: this publish names "
            "another tenant for a group that has messages (nothing was written)"
        )
    return error
