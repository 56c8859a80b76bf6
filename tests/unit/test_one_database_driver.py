"""One database driver at run time: psycopg. SQLAlchemy only declares the schema and runs the migrations.

The list of modules still importing SQLAlchemy only shrinks: a module that stops importing it must leave
`NOT_YET_MOVED`, and no new module may start.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = (REPO / "services", REPO / "operator")

# The schema's one MetaData and the Alembic machinery: SQLAlchemy's place for good.
SCHEMA = {"services/core/kdbl_core/db/schema.py", "services/core/kdbl_core/db/migrate.py"}
MIGRATIONS = "services/core/kdbl_core/db/migrations/"

# Run-time modules still on SQLAlchemy (issue 15, one database path): moved to psycopg step by step.
NOT_YET_MOVED: set[str] = set()


def _imports_sqlalchemy(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "sqlalchemy" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "sqlalchemy":
            return True
    return False


def _importers() -> set[str]:
    found = set()
    for root in ROOTS:
        for path in root.rglob("*.py"):
            rel = path.relative_to(REPO).as_posix()
            if not rel.startswith(MIGRATIONS) and _imports_sqlalchemy(path):
                found.add(rel)
    return found


def test_only_the_schema_and_modules_not_yet_moved_import_sqlalchemy() -> None:
    assert _importers() - SCHEMA == NOT_YET_MOVED


def test_administration_reports_and_the_embedded_server_run_on_psycopg() -> None:
    moved = {"services/control/kdbl_control/admin.py", "services/control/kdbl_control/file_report.py",
             "services/core/kdbl_core/db/embedded_postgres.py"}
    assert not moved & _importers()
    assert not (REPO / "services/core/kdbl_core/db/models.py").exists()  # the ORM mirror is gone


def test_the_worker_embeds_stores_vectors_and_serves_fetches_on_psycopg() -> None:
    moved = {"services/core/kdbl_core/content/vectors.py", "services/worker/kdbl_worker/vectorize.py",
             "services/worker/kdbl_worker/fetch.py"}
    assert not moved & _importers()


def test_eval_benchmarks_urls_and_the_cli_run_on_psycopg() -> None:
    moved = {f"services/control/kdbl_control/{name}.py"
             for name in ("evaluate", "beir", "bench", "bench_scale", "smoke", "proctime", "cli")}
    assert not (moved | {"services/core/kdbl_core/db/urls.py"}) & _importers()


def test_the_worker_write_path_the_crawl_queue_and_the_operator_run_on_psycopg() -> None:
    moved = {"services/core/kdbl_core/content/store.py", "services/worker/kdbl_worker/jobs.py",
             "services/worker/kdbl_worker/queue.py", "services/worker/kdbl_worker/pipeline.py",
             "services/worker/kdbl_worker/deadlines.py", "services/worker/kdbl_worker/bench_crawl.py",
             "services/worker/kdbl_worker/main.py", "operator/kdbl_operator/db_sync.py",
             "operator/kdbl_operator/handlers.py", "operator/kdbl_operator/reconcile.py"}
    assert all((REPO / path).exists() for path in moved)
    assert not moved & _importers()


def test_the_request_path_runs_on_psycopg_without_an_adapter_layer() -> None:
    api = {p.relative_to(REPO).as_posix() for p in (REPO / "services/api").rglob("*.py")}
    core = {f"services/core/kdbl_core/{name}.py" for name in (
        "search/lexical", "search/vector", "search/windows", "search/pipeline", "content/reads",
        "content/vectors", "db/connect", "db/async_pool", "access/principal", "access/tokens", "access/oidc",
        "access/policy")}
    assert all((REPO / path).exists() for path in core)
    assert not (api | core) & _importers()
    gone = ("engine", "driver", "pgpool")  # ContentDb/Session/Rows/ApiPool, `:name` rewriting, SQLAlchemy engines
    assert not [name for name in gone if (REPO / f"services/core/kdbl_core/db/{name}.py").exists()]
