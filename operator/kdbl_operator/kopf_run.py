"""The entry point of `kopf run --standalone -A -m kdbl_operator.kopf_run` (tests, development): kopf's own
CLI imports this module, which reads the process's settings once (`load_settings()`: the environment,
KDBL_* and KUBECONFIG) and registers the handlers with them in kopf's default registry.

`kdbl-operator` (kdbl_operator.main) does not import it: it reads its settings itself and registers the
handlers in a registry of its own (handlers.register).
"""

from __future__ import annotations

import kopf
from kdbl_core.settings import load_settings

from kdbl_operator import handlers

handlers.register(load_settings(), kopf.get_default_registry())
