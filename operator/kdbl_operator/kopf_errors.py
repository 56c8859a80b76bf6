"""How a K-Lake error reaches kopf: temporary or permanent, from the error's class.

`KdblError.temporary` decides (kdbl_core.errors): a TemporaryError (the database or the Kubernetes API
failed) and an InvalidSpec whose reason depends on another object (a Tenant, a Secret, a namespace) are
kopf.TemporaryError, retried after `delay`; anything else (a bad spec, a configuration fault) is
kopf.PermanentError, and kopf waits for the object to change.
"""

from __future__ import annotations

import kopf
from kdbl_core.errors import KdblError


def kopf_error_of(exc: KdblError, delay: float) -> kopf.TemporaryError | kopf.PermanentError:
    if exc.temporary:
        return kopf.TemporaryError(exc.message, delay=delay)
    return kopf.PermanentError(exc.message)
