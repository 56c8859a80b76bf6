"""Settings are passed, not fetched: each entry point reads them once (`load_settings()`, or the process's
object with `get_settings()`) and hands the Settings, or the values, down. The core, the worker, the API
and the operator call neither anywhere else, and never at import time (module level), except the entry
point kopf's own CLI imports.

kdbl_control is out of this walk: each of its commands is an entry point of `kdbl-control` (cli.py
reads the settings and passes them to most of them).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOPS = ("services/core", "services/worker", "services/api", "operator")
READERS = {"get_settings", "load_settings"}
SETTINGS_PY = "services/core/kdbl_core/settings.py"
# Each entry: a module allowed that many calls of get_settings()/load_settings(), and why.
ENTRY_POINTS: dict[str, tuple[int, str]] = {
    "services/api/kdbl_api/main.py": (2, "main() loads them; build() is the uvicorn factory each API worker "
                                         "process calls, its own entry point"),
    "services/worker/kdbl_worker/main.py": (1, "kdbl-worker's main()"),
    "services/worker/kdbl_worker/bench_embed.py": (1, "the embedding benchmark's main() (python -m)"),
    "services/worker/kdbl_worker/bench_crawl.py": (1, "the crawl benchmark's main() (python -m)"),
    "operator/kdbl_operator/main.py": (1, "kdbl-operator's main()"),
    "operator/kdbl_operator/kopf_run.py": (1, "`kopf run -m kdbl_operator.kopf_run`: importing it is the start"),
}
# Fetches deep in the core that remain until their callers pass settings (each names what it waits for).
NOT_YET_PASSED: dict[str, tuple[int, str]] = {
    "services/core/kdbl_core/db/embedded_postgres.py": (
        1, "EmbeddedDatabase(settings=None) falls back on the process's: kdbl_control.evaluate and "
           "kdbl_control.bench_commands construct it without settings"),
    "services/core/kdbl_core/content/bm25_lists.py": (
        1, "the pack's part size (bm25_build_part_postings): build()/build_all() take no settings yet "
           "(the worker's queue, `kdbl-control db compact` in cli.py, the benches)"),
}
MODULE_LEVEL_ALLOWED = {"operator/kdbl_operator/kopf_run.py"}


def python_files() -> Iterator[Path]:
    for top in TOPS:
        yield from sorted((ROOT / top).rglob("*.py"))


def settings_reads(path: Path) -> tuple[list[int], list[int]]:
    """Lines calling get_settings()/load_settings() (by name or as an attribute), and those of them at
    module level (run at import)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    in_functions: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            in_functions |= {n.lineno for n in ast.walk(node) if isinstance(n, ast.Call)}
    calls = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            if name in READERS:
                calls.append(node.lineno)
    return sorted(calls), sorted(line for line in calls if line not in in_functions)


def test_only_entry_points_read_the_settings():
    found = {}
    for path in python_files():
        rel = path.relative_to(ROOT).as_posix()
        if rel == SETTINGS_PY:
            continue
        calls, _ = settings_reads(path)
        allowed = (ENTRY_POINTS.get(rel) or NOT_YET_PASSED.get(rel) or (0, ""))[0]
        if len(calls) != allowed:
            found[rel] = calls
    assert not found, ("get_settings()/load_settings() outside the entry points: pass the Settings (or the value) "
                       f"down from main() or the constructor instead: {found}")


def test_nothing_reads_the_settings_at_import_time():
    found = {}
    for path in python_files():
        rel = path.relative_to(ROOT).as_posix()
        if rel != SETTINGS_PY and rel not in MODULE_LEVEL_ALLOWED and (lines := settings_reads(path)[1]):
            found[rel] = lines
    assert not found, f"settings read at import time: {found}"


def test_the_core_fetches_none_but_the_ones_not_yet_passed():
    core = {p for p in ENTRY_POINTS if p.startswith("services/core/")}
    assert not core  # the core has no entry point
    assert all(p.startswith("services/core/") for p in NOT_YET_PASSED)


def test_the_allow_lists_name_only_reads_that_still_exist():
    for rel, (count, _why) in {**ENTRY_POINTS, **NOT_YET_PASSED}.items():
        assert len(settings_reads(ROOT / rel)[0]) == count, rel


def test_the_walk_finds_calls_by_name_and_attribute_and_at_module_level(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("from kdbl_core import settings\nfrom kdbl_core.settings import get_settings\n"
                      "A = get_settings().api_port\n\n\ndef f():\n    return settings.load_settings()\n")
    assert settings_reads(sample) == ([3, 7], [3])
