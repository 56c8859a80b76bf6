"""kopf handlers for Tenant and Source: thin functions around `desired` (what), `reconcile` (database)
and `k8s` (Secrets, Events).

Level-triggered: create, update and resume run one idempotent reconcile; a timer re-runs it every
KDBL_OPERATOR_RESYNC_SECONDS to correct drift made behind the operator's back. Status conditions
(Ready / Reconciling / Degraded) say what happened; Events are posted on transitions and corrections.
An invalid spec never crashes anything: it sets Degraded with a precise reason, then either retries
with backoff (it depends on another object: a Tenant, a Secret, a namespace) or stops until the spec
changes (kopf.PermanentError). Finalizers delete a Source's / Tenant's rows in bounded batches.

Importing this module registers nothing: `register(cfg, registry)` does, with the settings its caller
read (the timers' interval is cfg.operator.resync_seconds; the startup handler hands cfg to every
handler in the memo). Run by `kdbl-operator` (leader election, health endpoint; main.run registers in a
registry of its own), or directly for tests and development:
`kopf run --standalone -A -m kdbl_operator.kopf_run` (kdbl_operator.kopf_run registers in kopf's default
registry).
"""

from __future__ import annotations

import asyncio
import copy
import functools
import logging
from collections import defaultdict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import kopf
from psycopg.rows import namedtuple_row
from psycopg_pool import ConnectionPool
from kdbl_core.access import tokens
from kdbl_core.db.connect import CONNECT_TIMEOUT_S, Pool, conninfo
from kdbl_core.errors import ConfigError, TemporaryError
from kdbl_core.settings import Settings

from kdbl_operator import desired, k8s, reconcile
from kdbl_operator.desired import GROUP, VERSION, InvalidSpec, Outcome
from kdbl_operator.kopf_errors import kopf_error_of

log = logging.getLogger(__name__)

KOPF_PREFIX = "kopf.kdbl.io"  # kopf's own bookkeeping annotations (kept apart from kdbl.io/ ones users set)
FINALIZER = "kdbl.io/cleanup"


# ------------------------------------------------------------------------------------------------
# operator lifecycle
# ------------------------------------------------------------------------------------------------
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, cfg: Settings, **_: Any) -> None:
    """`cfg`: the operator's settings, bound by register()."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=KOPF_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=KOPF_PREFIX, key="last-handled-configuration")
    settings.persistence.finalizer = FINALIZER
    settings.posting.loggers = False  # Events are explicit (k8s.event); handler logs stay in the log
    # A resync timer caught mid-run at shutdown or deletion finishes its short transaction instead of
    # being orphaned (with its database connection and API session) after a few event-loop cycles.
    settings.background.instant_exit_timeout = 2.0
    try:
        url = cfg.require_database_url("the owner-role URL of the K-Lake database")
        k8s.configure(cfg.operator.kubeconfig)
    except ConfigError as exc:
        raise kopf_error_of(exc, delay=0) from None  # permanent: a configuration fault
    memo.cfg = cfg
    memo.pool = _pool(url, cfg.operator.db_pool_size)
    # Database work runs on its own threads, so that shutdown can wait for what is in flight.
    memo.db_threads = ThreadPoolExecutor(max_workers=cfg.operator.db_pool_size * 2, thread_name_prefix="kdbl-db")
    memo.locks = defaultdict(asyncio.Lock)


async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    threads: ThreadPoolExecutor | None = getattr(memo, "db_threads", None)
    if threads is not None:  # a handler cancelled at shutdown may still finish its transaction
        await asyncio.to_thread(threads.shutdown, wait=True)
    pool: Pool | None = getattr(memo, "pool", None)
    if pool is not None:
        pool.close()
    k8s.close()


def _pool(url: str, size: int) -> Pool:
    """The operator's pool. Unlike connect.sync_pool it does not connect at start: the operator starts
    while the database is unreachable and its reconciles fail as TemporaryError (retried) until it is
    back. A connection is checked when taken (one that died with a database restart is replaced); a
    reconcile waits at most 10 s for one (the lock timeout of its transaction, db_sync.transaction)."""
    return ConnectionPool(conninfo(url), min_size=0, max_size=size, name="kdbl-operator", open=True,
                          timeout=10.0, max_lifetime=1800.0, check=ConnectionPool.check_connection,
                          kwargs={"row_factory": namedtuple_row, "connect_timeout": CONNECT_TIMEOUT_S})


async def _db(memo: kopf.Memo, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run one synchronous reconcile step (its own transaction) on the database threads."""
    return await asyncio.get_running_loop().run_in_executor(memo.db_threads, functools.partial(fn, *args, **kwargs))


def login(**kwargs: Any) -> kopf.ConnectionInfo:
    return k8s.login(**kwargs)


# ------------------------------------------------------------------------------------------------
# shared pieces
# ------------------------------------------------------------------------------------------------
def _plain(body: Mapping[str, Any]) -> dict[str, Any]:
    return copy.deepcopy({k: body[k] for k in body})


def _stamp(value: datetime | None = None) -> str:
    return (value or datetime.now(UTC)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _lock(memo: kopf.Memo, raw: Mapping[str, Any]) -> asyncio.Lock:
    meta = raw.get("metadata") or {}
    return memo.locks[(raw.get("kind"), meta.get("namespace") or "", meta.get("name"))]


def _unavailable(exc: TemporaryError) -> InvalidSpec:
    reason = desired.KUBERNETES_UNAVAILABLE if isinstance(exc, k8s.KubernetesUnavailable) else desired.DATABASE_UNAVAILABLE
    return InvalidSpec(reason, exc.message)


def _finish(raw: dict[str, Any], patch: kopf.Patch, new: dict[str, Any], outcome: Outcome, *, raise_errors: bool,
            retry: int, cfg: Settings) -> None:
    """Write the status delta, post an Event on a transition, and tell kopf whether to retry."""
    status = dict(raw.get("status") or {})
    generation = (raw.get("metadata") or {}).get("generation")
    if generation is not None:
        new["observedGeneration"] = generation
    new["conditions"] = desired.conditions(status.get("conditions"), outcome, generation=generation,
                                           now=datetime.now(UTC))
    new["phase"] = desired.phase(outcome)
    new["message"] = outcome.degraded.message if outcome.degraded else outcome.message
    for key, value in desired.status_patch(status, new).items():
        patch.status[key] = value
    event = desired.transition(status.get("conditions"), outcome)
    if event is not None:
        k8s.event(raw, type=event[0], reason=event[1], message=event[2])
    if outcome.degraded is not None:
        log.warning("%s %s degraded: %s", raw.get("kind"), (raw.get("metadata") or {}).get("name"),
                    outcome.degraded)
        if raise_errors:
            raise kopf_error_of(outcome.degraded, delay=cfg.operator.backoff(retry))


def _deleting(raw: dict[str, Any], patch: kopf.Patch, message: str) -> None:
    status = dict(raw.get("status") or {})
    outcome = Outcome(deleting=True, message=message)
    new = {"phase": "Deleting", "message": message,
           "conditions": desired.conditions(status.get("conditions"), outcome,
                                            generation=(raw.get("metadata") or {}).get("generation"),
                                            now=datetime.now(UTC))}
    for key, value in desired.status_patch(status, new).items():
        patch.status[key] = value


# ------------------------------------------------------------------------------------------------
# Tenant
# ------------------------------------------------------------------------------------------------
async def _bootstrap(raw: dict[str, Any], want: desired.DesiredTenant, tenant_id: Any,
                     memo: kopf.Memo) -> dict[str, Any]:
    """Keep exactly one live bootstrap token whose plaintext sits in the tenant's Secret."""
    boot, pool = want.bootstrap, memo.pool
    status = dict(raw.get("status") or {})
    if not boot.enabled:
        if await _db(memo, reconcile.revoke_all_bootstrap, pool, tenant_id):
            k8s.event(raw, type="Normal", reason="BootstrapTokenRevoked",
                      message="spec.bootstrapToken.enabled is false")
        return {"bootstrapSecretRef": None, "bootstrapToken": None}
    where = f"{boot.namespace}/{boot.secret_name}"
    secret = await k8s.read_secret(boot.namespace, boot.secret_name)
    if secret is not None and (not secret.managed_by_operator
                               or secret.labels.get(desired.LABEL_TENANT, want.name) != want.name):
        raise InvalidSpec(desired.NAME_CONFLICT, f"Secret {where} exists and is not this tenant's bootstrap Secret; "
                                                 "delete it or set spec.bootstrapToken.secretName")
    active = [t["lookup_id"] for t in await _db(memo, reconcile.active_bootstrap_tokens, pool, tenant_id)]
    token_status = dict(status.get("bootstrapToken") or {})
    rotate_to = ((raw.get("metadata") or {}).get("annotations") or {}).get(desired.ANNOTATION_ROTATE) or None
    plan = desired.plan_bootstrap(
        secret_lookup_id=secret.annotations.get(desired.ANNOTATION_LOOKUP_ID) if secret else None,
        secret_has_token=secret is not None and "token" in secret.keys, active_lookup_ids=active,
        rotate_to=rotate_to, rotated=token_status.get("rotation"))
    if plan.action == "mint":
        new = await asyncio.to_thread(tokens.generate)
        body = k8s.secret_body(
            namespace=boot.namespace, name=boot.secret_name, data={"token": new.token, "tenant": want.name},
            labels={desired.LABEL_MANAGED_BY: desired.MANAGER, desired.LABEL_TENANT: want.name},
            annotations={desired.ANNOTATION_LOOKUP_ID: new.lookup_id}, owner=raw)
        try:
            await k8s.write_secret(body)  # the plaintext goes to the Secret and nowhere else
        except k8s.NamespaceMissing:
            raise InvalidSpec(desired.NAMESPACE_NOT_FOUND, f"namespace '{boot.namespace}' for the bootstrap "
                                                           "Secret does not exist") from None
        del body
        await _db(memo, reconcile.record_bootstrap, pool, tenant_id, boot, new=(new.lookup_id, new.hash, new.fingerprint),
                  keep=None, revoke=plan.revoke)
        reason = "BootstrapTokenRotated" if plan.why == "rotation" else "BootstrapTokenIssued"
        k8s.event(raw, type="Normal", reason=reason,
                  message=f"wrote a new token (lookup id {new.lookup_id}) to Secret {where}"
                          + (f"; revoked {len(plan.revoke)} previous" if plan.revoke else ""))
        token_status = {"lookupId": new.lookup_id, "issuedAt": _stamp(),
                        "rotation": rotate_to or token_status.get("rotation") or ""}
    else:
        await _db(memo, reconcile.record_bootstrap, pool, tenant_id, boot, new=None,
                  keep=plan.keep_lookup_id, revoke=plan.revoke)
        token_status["lookupId"] = plan.keep_lookup_id
    return {"bootstrapSecretRef": {"name": boot.secret_name, "namespace": boot.namespace},
            "bootstrapToken": token_status}


async def _reconcile_tenant(body: Mapping[str, Any], patch: kopf.Patch, memo: kopf.Memo, *, retry: int,
                            resync: bool) -> None:
    raw, cfg = _plain(body), memo.cfg
    new: dict[str, Any] = {}
    async with _lock(memo, raw):
        try:
            want = desired.tenant(raw, operator_namespace=cfg.operator.namespace)
            done = await _db(memo, reconcile.converge_tenant, memo.pool, want)
            new.update(tenantId=str(done.row_id), counts=done.counts)
            if done.action == "adopt":
                k8s.event(raw, type="Normal", reason="Adopted",
                          message=f"took over tenant '{want.name}' from kdbl-control")
            elif resync and done.changed:
                k8s.event(raw, type="Normal", reason="DriftCorrected",
                          message=f"reset {', '.join(done.changed)} of tenant '{want.name}' to the spec")
            new.update(await _bootstrap(raw, want, done.row_id, memo))
            outcome = Outcome()
        except Exception as exc:  # noqa: BLE001 - every failure becomes a condition, never a dead loop
            outcome = _failure(raw, exc)
    _finish(raw, patch, new, outcome, raise_errors=not resync, retry=retry, cfg=cfg)


def _failure(raw: dict[str, Any], exc: Exception) -> Outcome:
    """The Degraded outcome for a failed reconcile; an unexpected error is logged and reported as internal."""
    if isinstance(exc, InvalidSpec):
        return Outcome(degraded=exc)
    if isinstance(exc, TemporaryError):
        return Outcome(degraded=_unavailable(exc))
    log.exception("reconciling %s %s failed", raw.get("kind"), (raw.get("metadata") or {}).get("name"))
    return Outcome(degraded=InvalidSpec(desired.INTERNAL_ERROR, f"{type(exc).__name__} (see the operator log)"))


async def tenant_changed(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, retry: int, **_: Any) -> None:
    await _reconcile_tenant(body, patch, memo, retry=retry, resync=False)


async def tenant_resync(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, stopped: Any, **_: Any) -> None:
    if stopped or (body.get("metadata") or {}).get("deletionTimestamp"):
        return
    await _reconcile_tenant(body, patch, memo, retry=0, resync=True)


async def tenant_deleted(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, retry: int, **_: Any) -> None:
    raw, cfg = _plain(body), memo.cfg
    name = (raw.get("metadata") or {}).get("name") or ""
    async with _lock(memo, raw):
        try:
            left = await _db(memo, reconcile.delete_tenant, memo.pool, name, desired.owner_marker(raw),
                                           batch=cfg.operator.delete_batch,
                                           max_batches=cfg.operator.delete_batches_per_pass)
        except TemporaryError as exc:
            raise kopf_error_of(exc, delay=cfg.operator.backoff(retry)) from None
    if left:
        _deleting(raw, patch, f"deleting tenant data: {left} files left")
        raise kopf.TemporaryError(f"{left} files left to delete", delay=min(1.0, cfg.operator.retry_base_seconds))
    memo.locks.pop((raw.get("kind"), "", name), None)
    log.info("tenant %s deleted from the database", name)


# ------------------------------------------------------------------------------------------------
# Source
# ------------------------------------------------------------------------------------------------
async def _reconcile_source(body: Mapping[str, Any], patch: kopf.Patch, memo: kopf.Memo, *, retry: int,
                            resync: bool) -> None:
    raw, cfg = _plain(body), memo.cfg
    new: dict[str, Any] = {}
    async with _lock(memo, raw):
        try:
            want = desired.source(raw, credentials_root=cfg.operator.credentials_root)
            for ref in (want.credentials, want.ca_secret):
                if ref is not None:
                    info = await k8s.read_secret(ref.namespace, ref.name)
                    desired.check_secret(ref, info.keys if info is not None else None)
            done = await _db(memo, reconcile.converge_source, memo.pool, want)
            counts = done.counts
            new.update(
                sourceId=str(done.row_id), tenantId=str(done.tenant_id), files=counts["files"],
                failedFiles=counts["failed_files"], chunks=counts["chunks"], embeddedChunks=counts["embedded_chunks"],
                embeddingProgress=desired.embedding_progress(counts["embedded_chunks"], counts["chunks"]),
                lastIndexedAt=_stamp(counts["last_indexed_at"]) if counts["last_indexed_at"] else None)
            if done.action == "adopt":
                k8s.event(raw, type="Normal", reason="Adopted",
                          message=f"took over source '{want.name}' of tenant '{want.tenant}' from kdbl-control")
            elif resync and done.changed:
                k8s.event(raw, type="Normal", reason="DriftCorrected",
                          message=f"reset {', '.join(done.changed)} of source '{want.name}' to the spec")
            outcome = Outcome()
        except Exception as exc:  # noqa: BLE001 - every failure becomes a condition, never a dead loop
            outcome = _failure(raw, exc)
    _finish(raw, patch, new, outcome, raise_errors=not resync, retry=retry, cfg=cfg)


async def source_changed(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, retry: int, **_: Any) -> None:
    await _reconcile_source(body, patch, memo, retry=retry, resync=False)


async def source_resync(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, stopped: Any, **_: Any) -> None:
    if stopped or (body.get("metadata") or {}).get("deletionTimestamp"):
        return
    await _reconcile_source(body, patch, memo, retry=0, resync=True)


async def source_deleted(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, retry: int, **_: Any) -> None:
    raw, cfg = _plain(body), memo.cfg
    async with _lock(memo, raw):
        try:
            left = await _db(memo, reconcile.delete_source, memo.pool, desired.owner_marker(raw),
                                           batch=cfg.operator.delete_batch,
                                           max_batches=cfg.operator.delete_batches_per_pass)
        except TemporaryError as exc:
            raise kopf_error_of(exc, delay=cfg.operator.backoff(retry)) from None
    if left:
        _deleting(raw, patch, f"deleting source data: {left} files left")
        raise kopf.TemporaryError(f"{left} files left to delete", delay=min(1.0, cfg.operator.retry_base_seconds))
    meta = raw.get("metadata") or {}
    memo.locks.pop((raw.get("kind"), meta.get("namespace") or "", meta.get("name")), None)
    log.info("source %s/%s deleted from the database", meta.get("namespace"), meta.get("name"))


# ------------------------------------------------------------------------------------------------
# registration
# ------------------------------------------------------------------------------------------------
def register(cfg: Settings, registry: kopf.OperatorRegistry) -> kopf.OperatorRegistry:
    """Register every handler in `registry` with the operator's settings `cfg`: the startup handler puts
    them in the memo (memo.cfg) for the others, the resync timers run every cfg.operator.resync_seconds.
    The handlers' ids are their function names, as when they were registered by decorators."""
    resync = cfg.operator.resync_seconds
    kopf.on.startup(registry=registry)(functools.partial(startup, cfg=cfg))  # id "startup"
    kopf.on.cleanup(registry=registry)(cleanup)
    kopf.on.login(registry=registry)(login)
    for plural, changed, resynced, deleted in (("tenants", tenant_changed, tenant_resync, tenant_deleted),
                                               ("sources", source_changed, source_resync, source_deleted)):
        for on in (kopf.on.update, kopf.on.create, kopf.on.resume):
            on(GROUP, VERSION, plural, registry=registry)(changed)
        kopf.timer(GROUP, VERSION, plural, interval=resync, initial_delay=resync, registry=registry)(resynced)
        kopf.on.delete(GROUP, VERSION, plural, registry=registry)(deleted)
    return registry
