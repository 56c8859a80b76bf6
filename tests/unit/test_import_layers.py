"""Layers the build enforces: the import-linter contracts in pyproject.toml ([tool.importlinter]).

The core imports no service; services (worker, API, control, operator) do not import each other, except
the one composition root `kdbl_control.compose` that `kdbl-control up` (and crawl, eval, formats) needs;
inside the core, the search pipeline sits over the domains (access, content, sources, the embedding
model), which do not import each other and sit over `db` (pools, schema, URLs) and the llama loader, over
settings and errors. Each third-party library of one concern stays in that concern's modules: the MCP SDK
in the API, llama_cpp in kdbl_core.llama_loader, kubernetes in kdbl_operator.k8s, kopf in the operator's
kopf-facing modules, SQLAlchemy/Alembic in the schema and migrations; the operator's `desired` is pure;
the API is layered (main, app, legacy_sse, the front door's stack over its parts, server..., tools...,
the parts, request_meta...).
`lint-imports` reads every import statement, also inside functions and under TYPE_CHECKING, and follows
indirect chains; one run over the 5 packages takes ~0.2 s.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")  # the venv's, installed by the `test` extra
PACKAGES = {"kdbl_core": "services/core", "kdbl_worker": "services/worker", "kdbl_api": "services/api",
            "kdbl_control": "services/control", "kdbl_operator": "operator"}


def _lint(cwd: Path, pythonpath: list[Path] | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(map(str, pythonpath))
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", "--config", str(cwd / "pyproject.toml")],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_the_code_keeps_every_layer_contract():
    result = _lint(REPO)
    assert result.returncode == 0, f"import-linter contracts broken:\n{result.stdout}\n{result.stderr}"
    assert "10 kept, 0 broken" in result.stdout


def _root(module: str) -> str:
    return module.split(".")[0]


def test_the_only_allowed_cross_service_imports_are_the_composition_roots():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    ignored = [i.split(" -> ") for c in config["contracts"] for i in c.get("ignore_imports", [])]
    across = {(importer, imported) for importer, imported in ignored
              if _root(imported) in PACKAGES and _root(importer) != _root(imported)}
    assert across and {importer for importer, _ in across} == {"kdbl_control.compose"}
    assert set(config["root_packages"]) == set(PACKAGES)


def test_each_library_of_one_concern_is_allowed_to_its_own_modules_only():
    """The ignore_imports of the contracts on external packages name exactly the modules allowed each one."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert config["include_external_packages"] is True
    allowed: dict[str, set[str]] = {}
    for contract in config["contracts"]:
        for importer, imported in (i.split(" -> ") for i in contract.get("ignore_imports", [])):
            if _root(imported) not in PACKAGES:
                allowed.setdefault(imported, set()).add(importer)
    assert allowed == {
        "llama_cpp": {"kdbl_core.llama_loader"},
        "kubernetes": {"kdbl_operator.k8s"},
        "kopf": {"kdbl_operator.main", "kdbl_operator.kopf_run", "kdbl_operator.handlers",
                 "kdbl_operator.kopf_errors", "kdbl_operator.k8s"},
        "sqlalchemy": {"kdbl_core.db.schema", "kdbl_core.db.migrate", "kdbl_core.db.migrations.**"},
        "alembic": {"kdbl_core.db.migrate", "kdbl_core.db.migrations.**"},
    }


def _copy(tmp_path: Path) -> list[Path]:
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    roots = []
    for package, root in PACKAGES.items():
        shutil.copytree(REPO / root / package, tmp_path / root / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
        roots.append(tmp_path / root)
    return roots


def test_a_worker_module_importing_the_api_inside_a_function_breaks_the_build(tmp_path):
    roots = _copy(tmp_path)
    module = tmp_path / "services/worker/kdbl_worker/sidecars.py"
    module.write_text(module.read_text() + "\n\ndef _sideways():\n    from kdbl_api import app  # noqa\n")
    result = _lint(tmp_path, roots)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "kdbl_worker.sidecars -> kdbl_api.app" in result.stdout


def test_a_core_module_importing_a_service_breaks_the_build(tmp_path):
    roots = _copy(tmp_path)
    module = tmp_path / "services/core/kdbl_core/errors.py"
    module.write_text(module.read_text() + "\n\nfrom kdbl_worker import pipeline  # noqa: E402\n")
    result = _lint(tmp_path, roots)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "kdbl_core.errors -> kdbl_worker.pipeline" in result.stdout


def test_a_domain_of_the_core_importing_another_or_the_search_pipeline_breaks_the_build(tmp_path):
    roots = _copy(tmp_path)
    module = tmp_path / "services/core/kdbl_core/content/uris.py"
    module.write_text(module.read_text() + "\n\nfrom kdbl_core.access import principal  # noqa: E402\n"
                      "from kdbl_core.search import pipeline  # noqa: E402\n")
    result = _lint(tmp_path, roots)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "kdbl_core.content.uris -> kdbl_core.access.principal" in result.stdout
    assert "kdbl_core.content.uris -> kdbl_core.search.pipeline" in result.stdout


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + text)


def test_a_library_imported_outside_its_concern_breaks_the_build(tmp_path):
    roots = _copy(tmp_path)
    _append(tmp_path / "services/control/kdbl_control/up.py",
            "\n\ndef _client():\n    from mcp.client import Client  # noqa\n")
    _append(tmp_path / "services/core/kdbl_core/chat.py", "\n\nimport llama_cpp  # noqa: E402\n")
    _append(tmp_path / "operator/kdbl_operator/handlers.py", "\n\nimport kubernetes  # noqa: E402\n")
    _append(tmp_path / "operator/kdbl_operator/reconcile.py", "\n\nimport kopf  # noqa: E402\n")
    _append(tmp_path / "services/core/kdbl_core/db/connect.py", "\n\nimport sqlalchemy  # noqa: E402\n")
    _append(tmp_path / "operator/kdbl_operator/desired.py", "\n\nfrom kdbl_core.db import connect  # noqa: E402\n")
    result = _lint(tmp_path, roots)
    assert result.returncode == 1, result.stdout + result.stderr
    for line in ("kdbl_control.up -> mcp", "kdbl_core.chat -> llama_cpp", "kdbl_operator.handlers -> kubernetes",
                 "kdbl_operator.reconcile -> kopf", "kdbl_core.db.connect -> sqlalchemy",
                 "kdbl_operator.desired -> kdbl_core.db.connect"):
        assert line in result.stdout, line
    assert "Contracts: 4 kept, 6 broken." in result.stdout  # one broken contract per library, and desired


def test_an_api_module_importing_a_layer_above_it_breaks_the_build(tmp_path):
    roots = _copy(tmp_path)
    _append(tmp_path / "services/api/kdbl_api/audit.py", "\n\nfrom kdbl_api import server  # noqa: E402\n")
    result = _lint(tmp_path, roots)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "kdbl_api.audit -> kdbl_api.server" in result.stdout
