"""`kdbl-operator`: reconcile Tenant and Source custom resources into the K-Lake database.

    kdbl-operator                     in a cluster: service account, leader election over a Lease
    kdbl-operator --kubeconfig PATH   from a workstation (or $KUBECONFIG / ~/.kube/config)
    kdbl-operator --standalone        no leader election (tests, a single dev instance)

Environment: KDBL_DATABASE_URL (owner role, required), KDBL_OPERATOR_NAMESPACE (its Lease and the
default home namespace of tenants), KDBL_OPERATOR_HEALTH_PORT (GET /healthz, default 8080), and the
tuning knobs of `Settings.operator` (kdbl_core.settings). It talks to nothing but the Kubernetes API
server and Postgres.

Replicas: every replica serves /healthz; only the holder of the Lease runs the kopf handlers. A
leader that loses the Lease stops its handlers and exits non-zero, so Kubernetes restarts it as a
follower. `--peering NAME` additionally enables kopf's own peering (needs kopf's peering CRDs),
which lets `kopf freeze` pause the operator while debugging.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import socket
import sys
import uuid
from typing import Any, NoReturn

from aiohttp import web
from kdbl_core import logging_setup
from kdbl_core.errors import ConfigError, exit_line_of
from kdbl_core.settings import Settings, load_settings

from kdbl_operator import k8s
from kdbl_operator.election import LeaderElector

log = logging.getLogger("kdbl_operator")
OWNER_URL = "the owner-role URL of the K-Lake database"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kdbl-operator", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then $KUBECONFIG, ~/.kube/config)")
    p.add_argument("--standalone", action="store_true", help="no leader election: the only instance")
    p.add_argument("--peering", metavar="NAME", help="also use kopf peering object NAME (kopf CRDs required)")
    p.add_argument("--priority", type=int, default=0, help="kopf peering priority (with --peering)")
    p.add_argument("--identity", default=None, help="leader-election identity (default: hostname + random)")
    return p


class Health:
    """What /healthz reports: alive while the election or the handlers run."""

    def __init__(self) -> None:
        self.role = "starting"
        self.ok = True

    async def handle(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok" if self.ok else "failing", "role": self.role},
                                 status=200 if self.ok else 503)


async def serve_health(host: str, port: int, health: Health) -> web.AppRunner:
    app = web.Application()
    app.router.add_get("/healthz", health.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


async def run(cfg: Settings, args: argparse.Namespace, *, stop: asyncio.Event | None = None,
              health: Health | None = None) -> int:
    """Serve /healthz, win the election (unless --standalone), run the kopf handlers until stopped.
    Returns the exit status: 1 when leadership was lost or the handlers failed."""
    import kopf

    from kdbl_operator import handlers

    # the handlers with the settings given here, in a registry of its own (kopf's default one adds only
    # fallback login handlers, which handlers.login replaces anyway)
    registry = handlers.register(cfg, kopf.OperatorRegistry())
    health = health or Health()
    op = cfg.operator
    k8s.use(op.kubeconfig)  # the election's client: from the settings given here
    runner = await serve_health(op.health_host, op.health_port, health)
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, stop.set)
    elector: LeaderElector | None = None
    if not args.standalone:
        identity = args.identity or f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}"
        elector = LeaderElector(namespace=op.namespace, name=op.lease_name, identity=identity,
                                lease_seconds=op.lease_seconds, renew_seconds=op.lease_renew_seconds)
    try:
        if elector is not None:
            health.role = "follower"
            if not await elector.acquire(stop):
                return 0
        health.role = "leader"
        kopf_stop = asyncio.Event()
        operator = asyncio.create_task(kopf.operator(
            clusterwide=True, standalone=args.peering is None, peering_name=args.peering,
            priority=args.priority, stop_flag=kopf_stop, registry=registry))
        waiters: list[asyncio.Task[Any]] = [operator, asyncio.create_task(stop.wait())]
        holder = asyncio.create_task(elector.hold(stop)) if elector is not None else None
        if holder is not None:
            waiters.append(holder)
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        lost = holder is not None and holder.done() and not stop.is_set()
        if lost:
            health.ok, health.role = False, "lost-leadership"
        kopf_stop.set()
        stop.set()
        failed = False
        try:
            await asyncio.wait_for(operator, timeout=60)
        except Exception:
            log.exception("the operator stopped with an error")
            failed = True
        for task in waiters:
            task.cancel()
        return 1 if lost or failed else 0
    finally:
        if elector is not None:
            await elector.release()
        await runner.cleanup()


def _fail(exc: ConfigError) -> NoReturn:
    line, code = exit_line_of(exc, "kdbl-operator")  # exit 2, as kdbl-control for a configuration fault
    print(line, file=sys.stderr)
    sys.exit(code)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        cfg = load_settings(**({"operator": {"kubeconfig": args.kubeconfig}} if args.kubeconfig else {}))
    except Exception as exc:  # noqa: BLE001 - pydantic's ValidationError: one line naming each bad variable
        _fail(exc if isinstance(exc, ConfigError) else ConfigError.of_settings(exc))
    logging_setup.configure(cfg.log_level, cfg.log_format)
    try:
        cfg.require_database_url(OWNER_URL)
        k8s.configure(cfg.operator.kubeconfig)
    except ConfigError as exc:
        _fail(exc)
    try:
        sys.exit(asyncio.run(run(cfg, args)))
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
