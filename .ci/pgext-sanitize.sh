#!/usr/bin/env bash
# The kdbl_bm25 extension's C code under AddressSanitizer and UndefinedBehaviorSanitizer (issue 27 §1).
#
#   .ci/pgext-sanitize.sh [pytest args...]     default: the hostile, fuzz and install tests; add
#                                              tests/integration/test_bm25_native.py for real searches
#   PGEXT_SOURCE=DIR .ci/pgext-sanitize.sh     DIR's kdbl_bm25.c instead (e.g. an older one, to see what
#                                              the sanitizers say about it), with this tree's scripts
#
# Builds kdbl_bm25.so twice into scratch prefixes and runs the tests against each: with
# -fsanitize=address, libasan preloaded into the embedded server (PostgreSQL itself is not instrumented:
# the runtime must come first); with -fsanitize=undefined,float-cast-overflow and no -fwrapv, so a signed
# overflow is reported too (any finding aborts the backend). The tests find the build through sys.prefix
# (kdbl_core.db.pgext.default_dir), so the venv's own build, which other sessions use, is left alone.
# Reports go to $WORK/{asan,ubsan}/report.*; the script fails on any report or failing test (a backend
# that a sanitizer aborts takes the postmaster through a restart, which the tests notice). Each pass
# takes ~1.5-2x the tests' normal time (~15 s for the default files, ~50 s with test_bm25_native, on 2
# cores).
#
# What it can and cannot see: ASan checks every load and store the extension makes against the malloc
# blocks around them. PostgreSQL's allocator carves small pallocs out of 8 kB blocks, so an overrun of a
# small chunk stays inside its block and is invisible; allocations over 8 kB (the fuzz test's ~10 kB
# lists, the dense accumulator, long lists) get their own malloc block and are checked to the byte.
# UBSan checks alignment (a misaligned int64 read), shifts, signed overflow and float-to-int casts in
# all of the extension's code.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="$ROOT/.venv/bin/python"
[ -x "$PY" ] || { echo "no $PY: run ./dev setup first" >&2; exit 2; }
ASAN_LIB="$(cc -print-file-name=libasan.so)"
[ -f "$ASAN_LIB" ] || { echo "no libasan for $(cc --version | head -1) (Debian: apt install libasan8)" >&2; exit 2; }

WORK="$(mktemp -d "${TMPDIR:-/tmp}/kdbl-pgext-sanitize-XXXXXX")"
if [ "$#" -eq 0 ]; then
    set -- tests/integration/test_bm25_hostile.py tests/integration/test_bm25_ext_install.py
fi
TESTS=("$@")

BUILD_PY='
import os, shutil, tempfile
from pathlib import Path
from kdbl_core.db import pgext
from kdbl_core.db.embedded_postgres import pg_binary

pg_config = Path(pg_binary("pg_config"))
pgext.CFLAGS = "-O1 -g -fno-omit-frame-pointer -fno-strict-aliasing -fexcess-precision=standard -Wall " \
    + os.environ["KDBL_SANITIZE_CFLAGS"]
stamp = pgext._fingerprint(pg_config)
if os.environ["KDBL_SANITIZE_SOURCE"]:  # another kdbl_bm25.c with this tree s scripts and Makefile
    scratch = Path(tempfile.mkdtemp())
    for name in pgext.SOURCES:
        shutil.copy2(pgext.SOURCE_DIR / name, scratch / name)
    shutil.copy2(Path(os.environ["KDBL_SANITIZE_SOURCE"]) / "kdbl_bm25.c", scratch / "kdbl_bm25.c")
    pgext.SOURCE_DIR = scratch
dest = Path(os.environ["KDBL_SANITIZE_PREFIX"]) / "kdbl-pgext"
dest.parent.mkdir(parents=True)
pgext.build(pg_config, dest)
(dest / "stamp").write_text(stamp + "\n")  # current for this tree: the tests take the build as it is
'
RUN_PY='
import os, sys
sys.prefix = os.environ["KDBL_SANITIZE_PREFIX"]
import pytest
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", *sys.argv[1:]]))
'

# build NAME CFLAGS: kdbl_bm25 into $WORK/NAME/kdbl-pgext
build() {
    echo "==> $1: building kdbl_bm25 with $2" >&2
    KDBL_SANITIZE_PREFIX="$WORK/$1" KDBL_SANITIZE_CFLAGS="$2" KDBL_SANITIZE_SOURCE="${PGEXT_SOURCE:-}" \
        "$PY" -c "$BUILD_PY"
}

# run NAME [VAR=value...]: the tests with sys.prefix at $WORK/NAME, so the server loads that build
run() {
    local name="$1"
    shift
    echo "==> $name: pytest ${TESTS[*]}" >&2
    env "$@" KDBL_SANITIZE_PREFIX="$WORK/$name" "$PY" -c "$RUN_PY" "${TESTS[@]}" || status=1
}

status=0
build asan "-fsanitize=address"
run asan LD_PRELOAD="$ASAN_LIB" ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:log_path=$WORK/asan/report"
# UBSan on its own: combined with ASan, GCC's UBSan reports ignore log_path
build ubsan "-fsanitize=undefined,float-cast-overflow -fno-sanitize-recover=all"
run ubsan UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$WORK/ubsan/report"

reports=$(find "$WORK/asan" "$WORK/ubsan" -maxdepth 1 -name 'report.*' | sort)
if [ -n "$reports" ]; then
    echo "==> sanitizer reports:" >&2
    for f in $reports; do
        echo "--- $f" >&2
        head -30 "$f" >&2
    done
    status=1
else
    echo "==> no ASan or UBSan report" >&2
fi
echo "==> tests and sanitizers: exit $status (files kept in $WORK)" >&2
exit "$status"
