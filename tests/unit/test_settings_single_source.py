"""One settings object: kdbl_core.settings is the only reader of the environment in services/ and operator/,
the operator's settings are its `operator` section, and every KDBL_* name the chart and docs use is one of
its fields."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from kdbl_core import settings as settings_module
from kdbl_core.settings import OperatorSettings, Settings, child_env, get_settings, load_settings, named_env

ROOT = Path(__file__).resolve().parents[2]
SETTINGS_PY = ROOT / "services/core/kdbl_core/settings.py"
# Each entry: a file allowed that many os.environ uses, and why it is not a configuration read.
ALLOWED: dict[str, tuple[int, str]] = {}  # none today: write defaults for C libraries with set_library_default
ENV_NAMES = {"environ", "environb", "getenv", "getenvb"}
# KDBL_* names in charts/docs that are not fields: variables *named* by data, read through named_env().
NOT_FIELDS = {
    "KDBL_API_DB_PASSWORD": "default of `kdbl-control db migrate --api-password-env`",
    "KDBL_WORKER_DB_PASSWORD": "default of `kdbl-control db migrate --worker-password-env`",
    "KDBL_AIRGAP_CACHE": "the airgap test harness's cache folder (tests/airgap), not the product's",
    "KDBL_AUTH_HEADER": "the mcp-remote recipe's own variable in docs/clients.md (mcp-remote expands it), not ours",
    **{name: "proposed in docs/scaling.md (issue 19's paper design past one database), not built"
       for name in ("KDBL_DATABASE_READ_URL", "KDBL_DB_GROUP", "KDBL_DB_READ_POOL_SIZE", "KDBL_READ_MAX_LAG_S",
                    "KDBL_OPERATOR_DATABASE")},
}


@pytest.fixture
def restore_process_settings() -> Iterator[None]:
    saved = settings_module._current
    yield
    settings_module._current = saved


def environment_uses(path: Path) -> list[int]:
    """Lines where a module touches os.environ / os.getenv (attribute access or `from os import ...`)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if (isinstance(node, ast.Attribute) and node.attr in ENV_NAMES and isinstance(node.value, ast.Name)
                and node.value.id == "os"):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os" and any(
                alias.name in ENV_NAMES for alias in node.names):
            lines.append(node.lineno)
    return sorted(lines)


def python_files() -> Iterator[Path]:
    for top in ("services", "operator"):
        yield from sorted((ROOT / top).rglob("*.py"))


def test_no_module_but_settings_reads_the_environment():
    found = {}
    for path in python_files():
        rel = path.relative_to(ROOT).as_posix()
        if path == SETTINGS_PY:
            continue
        lines = environment_uses(path)
        if lines and len(lines) != ALLOWED.get(rel, (0, ""))[0]:
            found[rel] = lines
    assert not found, f"os.environ/os.getenv outside kdbl_core/settings.py (use Settings, named_env, child_env): {found}"


def test_the_allow_list_names_only_uses_that_still_exist():
    for rel, (count, _why) in ALLOWED.items():
        assert len(environment_uses(ROOT / rel)) == count, rel


def test_the_walk_finds_attribute_reads_and_imports_of_the_environment(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("import os\nfrom os import getenv\nA = os.environ.get('X')\nB = os.getenv('Y')\nC = os.path.sep\n")
    assert environment_uses(sample) == [2, 3, 4]


def test_there_is_one_settings_class_and_the_operator_module_of_the_second_is_gone():
    classes = []
    for path in python_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                    getattr(base, "id", getattr(base, "attr", None)) == "BaseSettings" for base in node.bases):
                classes.append(f"{path.relative_to(ROOT).as_posix()}:{node.name}")
    assert classes == ["services/core/kdbl_core/settings.py:Settings"]
    assert not (ROOT / "operator/kdbl_operator/config.py").exists()


def test_the_operator_section_reads_kdbl_operator_variables_and_kubeconfig(monkeypatch):
    monkeypatch.setenv("KDBL_OPERATOR_NAMESPACE", "kdbl-system")
    monkeypatch.setenv("KDBL_OPERATOR_HEALTH_PORT", "9191")
    monkeypatch.setenv("KDBL_OPERATOR_DELETE_BATCHES_PER_PASS", "7")
    monkeypatch.setenv("KDBL_OPERATOR_RETRY_BASE_SECONDS", "0.5")
    monkeypatch.setenv("KUBECONFIG", "/etc/kube/config")
    monkeypatch.setenv("KDBL_DATABASE_URL", "postgresql://owner@db/kdbl")
    monkeypatch.delenv("KDBL_OPERATOR_DELETE_BATCH", raising=False)
    cfg = Settings()
    assert isinstance(cfg.operator, OperatorSettings)
    assert (cfg.operator.namespace, cfg.operator.health_port, cfg.operator.delete_batches_per_pass,
            cfg.operator.retry_base_seconds, cfg.operator.kubeconfig) == ("kdbl-system", 9191, 7, 0.5, "/etc/kube/config")
    assert cfg.require_database_url() == "postgresql://owner@db/kdbl"  # the same object holds the rest
    assert cfg.operator.delete_batch == 500 and cfg.operator.backoff(1) == 1.0


def test_section_values_given_in_code_merge_with_the_environment(monkeypatch):
    monkeypatch.setenv("KDBL_OPERATOR_NAMESPACE", "kdbl-system")
    monkeypatch.setenv("KUBECONFIG", "/etc/kube/config")
    cfg = Settings(operator={"health_port": 8181})
    assert (cfg.operator.health_port, cfg.operator.namespace, cfg.operator.kubeconfig) == (
        8181, "kdbl-system", "/etc/kube/config")


def test_an_invalid_operator_variable_is_refused_by_name(monkeypatch):
    monkeypatch.setenv("KDBL_OPERATOR_HEALTH_PORT", "0")
    with pytest.raises(ValueError, match="health_port"):
        Settings()


def test_every_kdbl_name_the_chart_and_docs_use_is_a_setting():
    fields = {f"KDBL_{name.upper()}" for name in Settings.model_fields} | {
        f"KDBL_OPERATOR_{name.upper()}" for name in OperatorSettings.model_fields}
    used = set()
    for top in ("charts", "docs", "operator"):
        for path in (ROOT / top).rglob("*"):
            if path.is_file() and path.suffix in {".md", ".yaml", ".yml", ".tpl", ".py", ".txt", ".json"}:
                used |= set(re.findall(r"KDBL_[A-Z0-9_]*[A-Z0-9]", path.read_text(errors="replace")))
    assert {"KDBL_OPERATOR_NAMESPACE", "KDBL_OPERATOR_HEALTH_PORT", "KDBL_DATABASE_URL"} <= used
    assert sorted(used - fields - set(NOT_FIELDS)) == []


def test_the_process_reads_its_settings_once(monkeypatch, restore_process_settings):
    monkeypatch.setenv("KDBL_API_PORT", "8181")
    loaded = load_settings()
    monkeypatch.setenv("KDBL_API_PORT", "8282")
    assert get_settings() is loaded and get_settings().api_port == 8181
    assert load_settings(api_port=8383).api_port == 8383 and get_settings().api_port == 8383


def test_the_default_model_is_looked_for_in_the_configured_model_dir(tmp_path):
    from kdbl_core.embedder import DEFAULT_MODEL_FILE, default_model_path

    settings = Settings(model_dir=tmp_path)
    assert default_model_path(settings.model_dir) is None
    (tmp_path / DEFAULT_MODEL_FILE).write_bytes(b"GGUF")
    assert default_model_path(settings.model_dir) == tmp_path / DEFAULT_MODEL_FILE
    assert Settings(model_dir="~/models").model_dir == Path.home() / "models"


def test_a_variable_named_at_run_time_is_read_when_asked(monkeypatch):
    assert named_env("KDBL_TEST_NAMED_SECRET") is None
    monkeypatch.setenv("KDBL_TEST_NAMED_SECRET", "s3cret")
    assert named_env("KDBL_TEST_NAMED_SECRET") == "s3cret"


def test_a_child_environment_keeps_what_the_filter_accepts_plus_the_extras(monkeypatch):
    monkeypatch.setenv("KDBL_DATABASE_URL", "postgresql://secret@db/kdbl")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    full = child_env({"KDBL_LOG_LEVEL": "WARNING"})
    assert full["KDBL_DATABASE_URL"] == "postgresql://secret@db/kdbl" and full["KDBL_LOG_LEVEL"] == "WARNING"
    filtered = child_env(keep=lambda name: name.startswith("LC_"))
    assert filtered["LC_ALL"] == "C.UTF-8" and "KDBL_DATABASE_URL" not in filtered
