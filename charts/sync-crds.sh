#!/usr/bin/env bash
# Copy the CRDs from operator/crds/ (the single source of truth) into the chart.
# Helm cannot read files outside the chart directory, so the chart carries a byte-identical copy
# in charts/kdbl/files/crds/; tests/chart checks that the two never drift.
#
#   charts/sync-crds.sh          copy
#   charts/sync-crds.sh --check  exit 1 when the copies differ (no changes made)
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${SCRIPT_DIR}/.." && pwd)"
SRC="${REPO_ROOT}/operator/crds"
DST="${SCRIPT_DIR}/kdbl/files/crds"

shopt -s nullglob
sources=("${SRC}"/*.yaml)
if [ "${#sources[@]}" -eq 0 ]; then
  echo "sync-crds: no CRDs in ${SRC}" >&2
  exit 1
fi

if [ "${1:-}" = "--check" ]; then
  status=0
  for f in "${sources[@]}"; do
    cmp -s "$f" "${DST}/$(basename "$f")" || { echo "sync-crds: $(basename "$f") differs" >&2; status=1; }
  done
  for f in "${DST}"/*.yaml; do
    [ -e "${SRC}/$(basename "$f")" ] || { echo "sync-crds: stale $(basename "$f") in chart" >&2; status=1; }
  done
  exit "${status}"
fi

mkdir -p "${DST}"
for f in "${DST}"/*.yaml; do
  [ -e "${SRC}/$(basename "$f")" ] || rm -f "$f"
done
for f in "${sources[@]}"; do
  cp "$f" "${DST}/$(basename "$f")"
done
echo "sync-crds: copied ${#sources[@]} CRD(s) into ${DST}"
