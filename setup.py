"""The compiled parts of the Python package: the snippet's scan and fragment writer (kdbl_core/search/_scan.c,
_fragments.c; docs/architecture.md, "Snippets"). Everything else is declared in pyproject.toml; setup.py is
setuptools' stable way to name a C extension (pyproject's `ext-modules` table is still experimental). A source
tree run without building uses their Python references (kdbl_core.search.snippets._matches_py, _snippet_py)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension(f"kdbl_core.search.{name}", sources=[f"services/core/kdbl_core/search/{name}.c"])
                   for name in ("_scan", "_fragments")])
