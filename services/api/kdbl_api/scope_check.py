"""The one scope check: which scope a JSON-RPC request needs, and the refusal when the token lacks it.

It used to be made twice: the front door refused a tools/call whose token lacked the tool's scope
(HTTP 403 `insufficient_scope`) and the tool dispatch checked the same scope again with another
message, a branch no HTTP request could reach. Now the front door asks `missing_scope` once per
request, from the body it already parsed (no second JSON parse, no database round trip: ~1 µs), and
nothing after it checks scopes. Resources (resources/*: get_file_text by another name) need
kdbl.read; a tool its registered scope; a tool outside the tenant's allowlist needs none
here, since the dispatch refuses it exactly as an unknown tool.
"""

from __future__ import annotations

from typing import Any

from kdbl_api.tools.registry import TOOLS
from kdbl_core.access.policy import TenantPolicy
from kdbl_core.access.principal import SCOPE_READ
from kdbl_core.errors import Forbidden

Call = tuple[str, str, Any]  # (method, tool name or method, arguments)


def required_scope(method: str, name: str, policy: TenantPolicy) -> str | None:
    """The scope a request needs (None: any valid token may make it)."""
    if method.startswith("resources/"):
        return SCOPE_READ
    if method == "tools/call" and policy.allows_tool(name):
        spec = TOOLS.get(name)
        return spec.scope if spec is not None else None
    return None


def missing_scope(calls: list[Call], scopes: frozenset[str], policy: TenantPolicy) -> str | None:
    """The first scope the calls need that `scopes` lacks, or None."""
    for method, name, _ in calls:
        needed = required_scope(method, name, policy)
        if needed is not None and needed not in scopes:
            return needed
    return None


def refusal(missing: str) -> Forbidden:
    """What every entry answers when its scope is missing: 403, -32003, data.required_scope."""
    return Forbidden(f"insufficient scope: this call needs '{missing}'", data={"required_scope": missing})
