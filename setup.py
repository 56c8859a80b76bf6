"""The one compiled part of the Python package: the snippet scan (kdbl_core/search/_scan.c; docs/architecture.md,
"Snippets"). Everything else is declared in pyproject.toml; setup.py is setuptools' stable way to name a C
extension (pyproject's `ext-modules` table is still experimental). A source tree run without building uses the
scan's Python reference (kdbl_core.search.snippets._matches_py)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("kdbl_core.search._scan", sources=["services/core/kdbl_core/search/_scan.c"])])
