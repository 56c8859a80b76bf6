"""`kdbl-control up`: the whole platform on one machine — embedded Postgres, crawl, MCP on localhost."""

from __future__ import annotations

import json
import os
import secrets
import socket
import sys
import threading
from pathlib import Path

import uvicorn
from sqlalchemy import text

from kdbl_api.app import create_app, load_embedder
from kdbl_control import admin
from kdbl_control.progress import crawl_with_progress
from kdbl_core.auth import pat
from kdbl_core.db.embedded import EmbeddedDatabase
from kdbl_core.db.engine import async_engine, sync_engine
from kdbl_core.db.urls import for_role
from kdbl_core.errors import ConfigError
from kdbl_core.settings import Settings
from kdbl_core.embed import Embedder, default_model_path
from kdbl_worker.embedding import embed_pending
from kdbl_worker.fetch import create_fetch_app
from kdbl_worker.pipeline import Indexer, load_sources

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


def _demo_token(owner_engine, data_dir: Path) -> str:
    """Reuse the token in DIR/demo-token while it is valid; otherwise mint and store a new one (0600)."""
    path = data_dir / "demo-token"
    if path.exists():
        token = path.read_text().strip()
        if pat.looks_like_pat(token):
            with owner_engine.connect() as conn:
                row = conn.execute(text(
                    "SELECT hash FROM tokens WHERE lookup_id = :l AND revoked_at IS NULL "
                    "AND (expires_at IS NULL OR expires_at > now())"), {"l": pat.parse(token).lookup_id}).first()
            if row and pat.verify(row.hash, token):
                return token
    token, _ = admin.create_token(owner_engine, tenant_name=DEMO_TENANT, name="demo")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(token + "\n")
    os.chmod(path, 0o600)
    return token


def client_config(url: str, token: str) -> str:
    return json.dumps({"mcpServers": {"kdbl": {
        "type": "streamable-http", "url": url, "headers": {"Authorization": f"Bearer {token}"}}}}, indent=2)


def _local_secrets(data_dir: Path) -> dict[str, str]:
    """Download-signing secret and internal fetch token for this data dir, kept in DIR/secrets.json (0600)."""
    path = data_dir / "secrets.json"
    if path.exists():
        return json.loads(path.read_text())
    values = {"download_signing_secret": secrets.token_urlsafe(48), "internal_fetch_token": secrets.token_urlsafe(48)}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(values, handle)
    return values


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def run_up(folders: list[Path], data_dir: Path, port: int, host: str = "127.0.0.1") -> int:
    _check_port(host, port)
    data_dir.mkdir(parents=True, exist_ok=True)
    local = _local_secrets(data_dir)
    fetch_port = free_port(host)
    model = os.environ.get("KDBL_EMBED_MODEL_PATH") or default_model_path()
    settings = Settings(
        mcp_enabled=True, api_public_url=f"http://{host}:{port}", worker_fetch_url=f"http://{host}:{fetch_port}",
        download_signing_secret=local["download_signing_secret"], internal_fetch_token=local["internal_fetch_token"],
        embed_model_path=str(model) if model else None,
    )
    if model is None:
        print("kdbl: no embedding model found: hybrid search degrades to lexical "
              "(build it with: python airgap/model/build_model.py)", file=sys.stderr)
    folders = [f.expanduser().resolve() for f in (folders or [default_folder()])]
    for folder in folders:
        if not folder.is_dir():
            raise ConfigError(f"{folder} is not a directory")
    print(f"kdbl: starting embedded PostgreSQL in {data_dir} ...", file=sys.stderr)
    with EmbeddedDatabase(data_dir) as db:
        owner = sync_engine(db.owner_url)
        admin.create_tenant(owner, DEMO_TENANT, display_name="Demo tenant", exist_ok=True)
        for folder in folders:
            admin.add_source(owner, DEMO_TENANT, protocol="fs", config={"root": str(folder)},
                             name=_source_name(owner, folder), exist_ok=True)
        worker = sync_engine(for_role(db.owner_url, "kdbl_worker"))
        indexer = Indexer(worker, settings)
        for source in load_sources(worker, tenant=DEMO_TENANT):
            crawl_with_progress(indexer, source)
        token = _demo_token(owner, data_dir)
        url = f"http://{host}:{port}/mcp"
        stop = threading.Event()
        # One model instance serves both the API's query embeddings and the background embedding.
        embedder = load_embedder(settings)
        rescanner = threading.Thread(target=_rescan, args=(indexer, worker, embedder, stop), daemon=True)
        rescanner.start()
        fetch = uvicorn.Server(uvicorn.Config(create_fetch_app(settings, worker), host=host, port=fetch_port,
                                              log_level="warning", server_header=False))
        threading.Thread(target=fetch.run, name="fetch", daemon=True).start()
        api_engine = async_engine(for_role(db.owner_url, "kdbl_api"))
        server = uvicorn.Server(uvicorn.Config(create_app(settings, api_engine, embedder), host=host, port=port,
                                               log_level="warning", lifespan="on", server_header=False))
        threading.Thread(target=_announce_when_listening, args=(server, stop, url, token, data_dir),
                         daemon=True).start()
        try:
            server.run()
        except KeyboardInterrupt:  # uvicorn re-raises the SIGINT it handled after a graceful shutdown
            pass
        finally:
            fetch.should_exit = True
            stop.set()
            rescanner.join(timeout=10)
            if embedder is not None:
                embedder.close()
            worker.dispose()
            owner.dispose()
    print("kdbl: stopped.", file=sys.stderr)
    return 0


def _announce_when_listening(server: uvicorn.Server, stop: threading.Event, url: str, token: str,
                             data_dir: Path) -> None:
    """Print the ready banner only once the socket accepts connections."""
    while not server.started:
        if stop.wait(0.05):
            return
    base = url.removesuffix("/mcp")
    print(f"\nK-Lake is serving MCP at {url}\nDemo token written to {data_dir / 'demo-token'} (0600).\n"
          f"Paste into an MCP client config:\n{client_config(url, token)}\n"
          f"Smoke test: kdbl-control --api-url {base} --api-token \"$(cat {data_dir / 'demo-token'})\" "
          f"mcp smoke\nCtrl-C to stop.", file=sys.stderr, flush=True)


def _source_name(owner, folder: Path) -> str:
    """The folder's name, made unique within the demo tenant when two folders share a name."""
    taken = {s["name"]: s["config"].get("root") for s in admin.list_sources(owner, DEMO_TENANT)}
    name = folder.name or "root"
    candidate, n = name, 1
    while candidate in taken and taken[candidate] != str(folder):
        n += 1
        candidate = f"{name}-{n}"
    return candidate


def _rescan(indexer: Indexer, worker, embedder: Embedder | None, stop: threading.Event) -> None:
    """Embed what the first crawl wrote (lexical first: search works meanwhile), then pick up edits:
    re-crawl every RESCAN_SECONDS (unchanged files cost a stat) and embed the changes."""
    settings = indexer.settings
    while True:
        if embedder is not None:
            try:
                count = embed_pending(worker, embedder, batch=settings.embed_batch, stop=stop)
                if count:
                    print(f"kdbl: embedded {count} chunks for hybrid search", file=sys.stderr)
            except Exception as exc:  # noqa: BLE001 - keep serving lexically
                print(f"kdbl: embedding failed: {exc}", file=sys.stderr)
        if stop.wait(RESCAN_SECONDS):
            return
        for source in load_sources(worker, tenant=DEMO_TENANT):
            try:
                indexer.crawl(source)
            except Exception as exc:  # noqa: BLE001 - keep serving; the next pass retries
                print(f"kdbl: re-crawl of {source.id} failed: {exc}", file=sys.stderr)
