#!/usr/bin/env bash
# Put the 28 documents questions.jsonl asks about into one folder, checked against manifest.json.
#
#   docs/eval/longdocs/assemble.sh OUT_DIR ITSARAG
#
# ITSARAG: a checkout (or bare clone) of github.com/francesco-sodano/itsarag holding commit eadd729, whose
# data/fsi/pdf/ has the 20 SEC 10-K filings. The R manuals come from Debian's r-doc-pdf package
# (apt-get download; no installation). Then: kdbl-control eval OUT_DIR --questions docs/eval/longdocs/questions.jsonl
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: assemble.sh OUT_DIR ITSARAG}
repo=${2:?usage: assemble.sh OUT_DIR ITSARAG (a clone of github.com/francesco-sodano/itsarag)}
commit=eadd729
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "==> the 20 filings from $repo at $commit" >&2
git -C "$repo" ls-tree -r --name-only "$commit" -- data/fsi/pdf | while IFS= read -r path; do
    git -C "$repo" cat-file -p "$commit:$path" > "$out/$(basename "$path")"
done

echo "==> the R manuals from Debian's r-doc-pdf" >&2
(cd "$work" && apt-get download r-doc-pdf=4.2.2.20221110-2 >/dev/null)
dpkg -x "$work"/r-doc-pdf_*.deb "$work/x"
for name in R-FAQ R-admin R-data R-exts R-intro R-ints R-lang refman; do
    cp "$work/x/usr/share/R/doc/manual/$name.pdf" "$out/"
done

echo "==> checking against manifest.json" >&2
python3 - "$out" "$here/manifest.json" <<'EOF'
import hashlib, json, sys
from pathlib import Path
out, manifest = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
bad = [n for n, m in manifest["documents"].items()
       if not (out / n).is_file() or hashlib.sha256((out / n).read_bytes()).hexdigest() != m["sha256"]]
sys.exit(f"not as in the manifest: {bad}" if bad else print(f"{len(manifest['documents'])} documents in {out}"))
EOF
