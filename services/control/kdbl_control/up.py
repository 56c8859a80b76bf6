"""`kdbl-control up`: the whole platform on one machine — embedded Postgres, crawl, MCP on localhost.

MCP is served as soon as the database is up (~3 s); the first crawl and the embedding run behind it,
so a folder with one 10 MB file no longer keeps `up` from serving (search finds what is indexed so
far; `list_sources` shows the counts grow). Ctrl-C and SIGTERM stop the API, the crawl and the
embedded PostgreSQL in order (uvicorn re-raises the SIGTERM it handled; without a handler of ours
that killed the process and orphaned the server).

Secrets, with everything in one process as one OS user (issue 27: a symbolic link in a crawled folder
read them back through search). What holds: the download-signing secret and the internal fetch token
exist only in this process's memory, fresh at each start (links signed before a restart stop working;
they last 15 minutes unless a tenant policy sets link_ttl_seconds), so there is no file of them to read;
DIR/secrets.json, which an earlier release wrote, is deleted. The data folder (pg-password, the demo
token, the database's own files) is registered with the crawl (`compose.refuse_paths`): no source reads
it, through a symbolic link, a hard link, or a folder that contains it (`up .` with DIR=.kdbl inside).
What does not hold: file permissions cannot keep pg-password from the crawl's process, which is the
API's and the database client's too; a parser exploited in an extraction child runs as the same user
and could read it. Run the services as separate users (the Helm chart does) where that matters.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import uvicorn
from pydantic import SecretStr

from kdbl_control import admin, compose
from kdbl_control.progress import crawl_with_progress
from kdbl_core.access import tokens
from kdbl_core.access.principal import tenant_transaction
from kdbl_core.content import vectors
from kdbl_core.db.connect import Pool, sync_pool
from kdbl_core.db.embedded_postgres import EmbeddedDatabase
from kdbl_core.db.urls import for_role
from kdbl_core.embedder import Embedder, default_model_path
from kdbl_core.errors import ConfigError
from kdbl_core.settings import Settings, get_settings

DEMO_TENANT = "demo"
RESCAN_SECONDS = 30.0


def default_folder() -> Path:
    repo_docs = Path(__file__).resolve().parents[3] / "docs"
    return repo_docs if repo_docs.is_dir() else Path.cwd()


def _check_port(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            raise ConfigError(f"port {port} on {host} is already in use (pick another with --port)") from None


def _demo_token(owner: Pool, data_dir: Path) -> str:
    """Reuse the token in DIR/demo-token while it is valid; otherwise mint and store a new one (0600)."""
    path = data_dir / "demo-token"
    if path.exists():
        token = path.read_text().strip()
        if tokens.looks_like_pat(token):
            with owner.connection() as conn:
                row = conn.execute(
                    "SELECT hash FROM tokens WHERE lookup_id = %s AND revoked_at IS NULL "
                    "AND (expires_at IS NULL OR expires_at > now())", (tokens.parse(token).lookup_id,)).fetchone()
            if row and tokens.verify_secret(row.hash, token):
                return token
    token, _ = admin.create_token(owner, tenant_name=DEMO_TENANT, name="demo")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(token + "\n")
    os.chmod(path, 0o600)
    return token


def client_config(url: str, token: str) -> str:
    return json.dumps({"mcpServers": {"kdbl": {
        "type": "streamable-http", "url": url, "headers": {"Authorization": f"Bearer {token}"}}}}, indent=2)


def _write_client_config(data_dir: Path, url: str, token: str) -> Path:
    """The ready-to-use client config, token included, in DIR/mcp-client.json (0600): the banner shows
    it with a placeholder, so the token never reaches a terminal, a log or a screen share."""
    path = data_dir / "mcp-client.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(client_config(url, token) + "\n")
    os.chmod(path, 0o600)
    return path


def control_command() -> str:
    """How to run kdbl-control from any shell: the executable beside this Python (.venv/bin is often
    not on PATH), else this Python with -m."""
    for candidate in (Path(sys.argv[0]) if Path(sys.argv[0]).name == "kdbl-control" else None,
                      Path(sys.executable).parent / "kdbl-control"):
        if candidate is not None and candidate.is_file() and os.access(candidate, os.X_OK):
            return shlex.quote(str(candidate.absolute()))
    found = shutil.which("kdbl-control")
    return shlex.quote(found) if found else f"{shlex.quote(sys.executable)} -m kdbl_control.cli"


WILDCARDS = ("0.0.0.0", "::", "")
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def host_names(host: str) -> list[str]:
    """The Host header names `--host` lets through besides loopback's (KDBL_ALLOWED_HOSTS adds more).

    A specific address or name allows itself. Every interface (0.0.0.0 or ::) allows the machine's
    host name, its fully qualified name, each interface address and host.docker.internal (how a
    container on this machine reaches it) — never any Host: DNS-rebinding protection stays on.
    """
    if host in LOOPBACK:
        return []
    if host not in WILDCARDS:
        return [host]
    import psutil

    names = {socket.gethostname(), socket.getfqdn(), "host.docker.internal"}
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family in (socket.AF_INET, socket.AF_INET6):
                names.add(address.address.split("%")[0])
    return sorted(n for n in names if n and n not in LOOPBACK)


def _allowed(settings: Settings, host: str) -> dict[str, list[str]]:
    hosts, origins = list(settings.allowed_hosts), list(settings.allowed_origins)
    for name in host_names(host):
        literal = f"[{name}]" if ":" in name else name
        hosts.append(f"{literal}:*")
        origins.append(f"http://{literal}:*")
    return {"allowed_hosts": hosts, "allowed_origins": origins}


def _run_secrets(data_dir: Path) -> dict[str, str]:
    """Download-signing secret and internal fetch token for this run, in memory only (module docstring);
    the DIR/secrets.json an earlier release kept them in is removed."""
    (data_dir / "secrets.json").unlink(missing_ok=True)
    return {"download_signing_secret": secrets.token_urlsafe(48), "internal_fetch_token": secrets.token_urlsafe(48)}


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class Stopping(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C: the `with` blocks unwind and stop the server in order."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise Stopping()


def run_up(folders: list[Path], data_dir: Path, port: int, host: str = "127.0.0.1",
           settings: Settings | None = None) -> int:
    """`settings`: the process's (KDBL_*), which `up` completes with its own URLs, secrets and model."""
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return _run_up(folders, data_dir, port, host, settings or get_settings())
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM before serving: everything opened is closed
        print("kdbl: stopped.", file=sys.stderr)
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_up(folders: list[Path], data_dir: Path, port: int, host: str, env: Settings) -> int:
    _check_port(host, port)
    folders = [f.expanduser().resolve() for f in (folders or [default_folder()])]
    for folder in folders:
        if not folder.is_dir():
            raise ConfigError(f"{folder} is not a directory")
    if not data_dir.exists():
        data_dir.mkdir(parents=True, mode=0o700)
    local = _run_secrets(data_dir)
    compose.refuse_paths(data_dir)  # before any crawl: no source reads the data folder, by any path
    loopback = "127.0.0.1" if host in WILDCARDS else host
    fetch_port = free_port(loopback)
    model = env.embed_model_path or default_model_path(env.model_dir)
    # links to originals use it: on every interface, KDBL_API_PUBLIC_URL names the address clients use
    base_url = f"http://{'localhost' if host in WILDCARDS else host}:{port}"
    public_url = env.api_public_url or base_url
    settings = env.model_copy(update={
        "mcp_enabled": True, "api_public_url": public_url, "worker_fetch_url": f"http://{loopback}:{fetch_port}",
        "download_signing_secret": SecretStr(local["download_signing_secret"]),
        "internal_fetch_token": SecretStr(local["internal_fetch_token"]),
        "embed_model_path": str(model) if model else None,
    })
    settings = settings.model_copy(update=_allowed(settings, host))
    if model is None:
        print("kdbl: no embedding model found: hybrid search degrades to lexical "
              "(build it with: python airgap/model/build_model.py)", file=sys.stderr)
    print(f"kdbl: starting embedded PostgreSQL in {data_dir} ...", file=sys.stderr)
    with EmbeddedDatabase(data_dir, settings=settings) as db:
        if db.stale_pid:
            print(f"kdbl: stopped a PostgreSQL server (pid {db.stale_pid}) that an earlier run left behind "
                  "when it was killed; started a fresh one on the same data", file=sys.stderr)
        owner = sync_pool(db.owner_url, size=2, name="kdbl-up-owner")
        admin.create_tenant(owner, DEMO_TENANT, display_name="Demo tenant", exist_ok=True)
        for folder in folders:
            admin.add_source(owner, DEMO_TENANT, protocol="fs", config={"root": str(folder)},
                             name=_source_name(owner, folder), exist_ok=True)
        # the crawl's queue loop, heartbeat, deadline watchdog and writers' bookkeeping
        worker = sync_pool(for_role(db.owner_url, "kdbl_worker"), size=6, name="kdbl-up-crawl")
        worker_pool = sync_pool(for_role(db.owner_url, "kdbl_worker"), size=2, name="kdbl-up-worker")
        indexer = compose.indexer(worker, settings)
        token = _demo_token(owner, data_dir)
        url = f"{base_url}/mcp"
        stop = threading.Event()
        # One model instance serves the API's query embeddings (first in line) and the background embedding.
        embedder = compose.load_embedder(settings)
        background = threading.Thread(target=_background, args=(indexer, worker, worker_pool, embedder, stop),
                                      name="crawl", daemon=True)
        fetch = uvicorn.Server(uvicorn.Config(compose.create_fetch_app(settings, worker_pool), host=loopback,
                                              port=fetch_port,
                                              log_level="warning", server_header=False))
        threading.Thread(target=fetch.run, name="fetch", daemon=True).start()
        api = compose.create_api_app(settings, for_role(db.owner_url, "kdbl_api"), embedder)
        server = uvicorn.Server(uvicorn.Config(api, host=host, port=port,
                                               log_level="warning", lifespan="on", server_header=False,
                                               proxy_headers=False))  # X-Forwarded-For: KDBL_TRUSTED_PROXIES only
        banner = _banner(url, data_dir, _write_client_config(data_dir, url, token), settings, host)
        threading.Thread(target=_announce_when_listening, args=(server, stop, banner, background),
                         daemon=True).start()
        try:
            server.run()
        except KeyboardInterrupt:  # uvicorn re-raises the SIGINT/SIGTERM it handled after a graceful shutdown
            pass
        finally:
            fetch.should_exit = True
            stop.set()
            if background.is_alive():
                background.join(timeout=30)
            if embedder is not None:
                embedder.close()
            worker.close()
            worker_pool.close()
            owner.close()
    print("kdbl: stopped.", file=sys.stderr)
    return 0


def _banner(url: str, data_dir: Path, config_file: Path, settings: Settings, host: str) -> str:
    token_file = data_dir / "demo-token"
    placeholder = "<the token in " + str(token_file) + ">"
    lines = [f"\nK-Lake is serving MCP at {url}",
             f"Demo token written to {token_file} (0600); the client config with it to {config_file} (0600):",
             client_config(url, placeholder)]
    if host not in LOOPBACK:
        lines.append("Host headers accepted (add more with KDBL_ALLOWED_HOSTS): "
                     + ", ".join(settings.allowed_hosts))
    if settings.legacy_sse_enabled:
        lines.append(f"Legacy HTTP+SSE (2024-11-05) clients: {url.removesuffix('/mcp')}/sse with the same "
                     "Authorization: Bearer header")
    lines += [f"Smoke test: {control_command()} --api-url {shlex.quote(url.removesuffix('/mcp'))} "
              f"--api-token-file {shlex.quote(str(token_file))} mcp smoke",
              "Indexing continues in the background (search finds what is indexed so far; "
              "list_sources shows the counts). Ctrl-C to stop."]
    return "\n".join(lines)


def _announce_when_listening(server: uvicorn.Server, stop: threading.Event, banner: str,
                             background: threading.Thread) -> None:
    """Print the ready banner once the socket accepts connections, then start the first crawl."""
    while not server.started:
        if stop.wait(0.05):
            return
    print(banner, file=sys.stderr, flush=True)
    background.start()


def _source_name(owner: Pool, folder: Path) -> str:
    """The folder's name, made unique within the demo tenant when two folders share a name."""
    taken = {s["name"]: s["config"].get("root") for s in admin.list_sources(owner, DEMO_TENANT)}
    name = folder.name or "root"
    candidate, n = name, 1
    while candidate in taken and taken[candidate] != str(folder):
        n += 1
        candidate = f"{name}-{n}"
    return candidate


class EmbeddingProgress:
    """Tells the terminal how the background embedding goes, every `every_s` seconds: chunks embedded of
    those pending when it began, the rate, the time left."""

    def __init__(self, pool: Pool, model_id: str, every_s: float = 10.0, tenant: str = DEMO_TENANT) -> None:
        with pool.connection() as conn:
            row = conn.execute("SELECT id FROM tenants WHERE name = %s", (tenant,)).fetchone()
        self.pending = 0
        if row is not None:
            with tenant_transaction(pool, row[0]) as conn:
                self.pending = vectors.count_pending(conn, model_id)
        self.every_s, self.started = every_s, time.monotonic()
        self.next = self.started + every_s

    def __call__(self, done: int) -> None:
        now = time.monotonic()
        if now < self.next or not self.pending:
            return
        self.next = now + self.every_s
        print(f"kdbl: {embedding_line(done, self.pending, done / (now - self.started))}", file=sys.stderr,
              flush=True)


EMBED_SLICE_BATCHES = 25  # batches of embedding between two looks for files whose entities wait


def _read_entities(worker_pool: Pool, stop: threading.Event) -> None:
    """Named entities of the files that wait for them (sources with entities on: kdbl_worker.entity_stage)."""
    try:
        count = compose.extract_entities(worker_pool, stop=stop)
        if count:
            print(f"kdbl: read the named entities of {count} files", file=sys.stderr)
    except Exception as exc:  # noqa: BLE001 - keep serving
        if not stop.is_set():
            print(f"kdbl: entity extraction failed: {exc}", file=sys.stderr)


def _embed(worker_pool: Pool, embedder: Embedder, batch: int, stop: threading.Event) -> None:
    """Embed what waits, in slices: between two, the files whose entities wait are read, so turning entities
    on (`source update --entities`) during a long embedding is not left until it ends (a 10 MB file's
    10,000 chunks took ~8 min here). Small batches: a stop (and a query, which goes first anyway) waits at
    most one of them."""
    progress = EmbeddingProgress(worker_pool, embedder.model_id)
    size, done = min(batch, 8), 0
    while not stop.is_set():
        count = compose.embed_pending(worker_pool, embedder, batch=size, stop=stop, max_batches=EMBED_SLICE_BATCHES,
                                      progress=lambda n, before=done: progress(before + n))
        done += count
        if count < size * EMBED_SLICE_BATCHES or stop.is_set():  # nothing left, or stopped
            break
        _read_entities(worker_pool, stop)
    if done:
        print(f"kdbl: embedded {done} chunks for hybrid search", file=sys.stderr)


def embedding_line(done: int, pending: int, rate: float) -> str:
    """'embedding for hybrid search: 1,234 of 10,000 chunks (12%), 21.0 chunks/s, about 7 min left'."""
    left = max(pending - done, 0) / rate if rate > 0 else None
    eta = ("time left unknown" if left is None else "about " + (
        f"{left:.0f} s" if left < 90 else f"{left / 60:.0f} min" if left < 5400 else f"{left / 3600:.1f} h") + " left")
    return (f"embedding for hybrid search: {done:,} of {pending:,} chunks ({100 * done / max(pending, 1):.0f}%), "
            f"{rate:.1f} chunks/s, {eta}")


def _background(indexer: compose.Indexer, worker: Pool, worker_pool: Pool, embedder: Embedder | None,
                stop: threading.Event) -> None:
    """Crawl every source (lexical first: search works meanwhile), embed what it wrote, then pick up
    edits: re-crawl every RESCAN_SECONDS (unchanged files cost a stat) and embed the changes."""
    settings = indexer.settings
    first = True
    while not stop.is_set():
        for source in compose.load_sources(worker, tenant=DEMO_TENANT):
            if stop.is_set():
                return
            try:
                if first:
                    crawl_with_progress(indexer, source, stop=stop)
                else:
                    indexer.crawl(source, stop=stop)
            except Exception as exc:  # noqa: BLE001 - keep serving; the next pass retries
                if stop.is_set():
                    return
                print(f"kdbl: crawl of source {source.id} failed: {exc}", file=sys.stderr)
        first = False
        _read_entities(worker_pool, stop)
        if embedder is not None:
            try:
                _embed(worker_pool, embedder, settings.embed_batch, stop)
            except Exception as exc:  # noqa: BLE001 - keep serving lexically
                if stop.is_set():
                    return
                print(f"kdbl: embedding failed: {exc}", file=sys.stderr)
        if stop.wait(RESCAN_SECONDS):
            return
