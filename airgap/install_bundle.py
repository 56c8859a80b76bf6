#!/usr/bin/env python3
"""Verify K-Lake's airgap bundle and load it into a private registry, then print the helm install line.

    python airgap/install_bundle.py BUNDLE --registry REGISTRY [--insecure | --insecure-tls]
                                    [--creds USER:PASSWORD] [--dry-run] [--verify-only]

BUNDLE is the bundle directory or its .tar. Steps:

1. Verify every file against SHA256SUMS. Any mismatched, missing or unlisted file fails the run
   before anything is pushed.
2. Push each image in images.txt with skopeo (``--preserve-digests``):
   oci-archive:images/<file>  ->  docker://REGISTRY/<name>:<tag>, then read the pushed manifest back
   and compare its digest with images.txt.
3. Push the chart: helm push charts/kdbl-<version>.tgz oci://REGISTRY/charts
4. Print the helm install line (global.imageRegistry=REGISTRY, images pinned by digest).

REGISTRY is host[:port][/path], e.g. registry.local:5000 or harbor.example/k-lake. --insecure talks
plain HTTP (loopback test registries); --insecure-tls talks HTTPS without certificate checks.
Needs skopeo and helm (the bundle does not carry them: install Debian's skopeo and the helm binary on
the loading host). Standard library only; nothing here reaches the internet.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bundlelib import (
    BundleError,
    ImageEntry,
    log,
    read_images_txt,
    read_manifest,
    require_verified,
    run,
    sha256_text,
)


def extract_tar(tar: Path, dest: Path) -> Path:
    """Extract a bundle tar (one top directory, plain files only) and return that directory."""
    with tarfile.open(tar) as tf:
        members = tf.getmembers()
        tops = {m.name.split("/", 1)[0] for m in members}
        if len(tops) != 1:
            raise BundleError(f"{tar}: expected one top-level directory, found {sorted(tops)}")
        for m in members:
            if not (m.isfile() or m.isdir()) or m.name.startswith("/") or ".." in m.name.split("/"):
                raise BundleError(f"{tar}: refusing member {m.name!r} (only plain files and directories)")
        if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4 (Debian bookworm ships 3.11.2)
            tf.extractall(dest, filter="data")
        else:  # members were checked above: plain files and directories, no absolute or '..' paths
            tf.extractall(dest)
    return dest / tops.pop()


def find_tool(name: str, explicit: str | None) -> str:
    if explicit:
        return explicit
    if name == "helm":
        local = Path(__file__).resolve().parents[1] / "tools" / "bin" / "helm"
        if local.exists():
            return str(local)
    found = shutil.which(name)
    if not found:
        raise BundleError(f"{name} not found on PATH (pass --{name} PATH)")
    return found


def registry_host(registry: str) -> str:
    reg = registry.strip().removeprefix("docker://").removeprefix("oci://").rstrip("/")
    if not reg or "://" in reg or " " in reg:
        raise BundleError(f"--registry {registry!r}: expected host[:port][/path]")
    return reg


def _run_redacted(cmd: list[str], secret: str | None, capture: bool = False):
    """run() that never shows the registry password in an error message."""
    try:
        return run(cmd, quiet=True, capture=capture)
    except BundleError as exc:
        if secret:
            raise BundleError(str(exc).replace(secret, "***")) from None
        raise


def push_image(skopeo: str, root: Path, img: ImageEntry, registry: str, args: argparse.Namespace) -> str:
    dest = f"docker://{registry}/{img.ref}"
    tls = ["--dest-tls-verify=false"] if (args.insecure or args.insecure_tls) else []
    creds = ["--dest-creds", args.creds] if args.creds else []
    cmd = [
        skopeo,
        "copy",
        "--quiet",
        "--retry-times",
        "3",
        "--preserve-digests",
        *tls,
        *creds,
        f"oci-archive:{root / img.archive}",
        dest,
    ]
    if args.dry_run:
        print(
            "DRY-RUN " + shlex.join(cmd if not creds else [c if c != args.creds else "USER:***" for c in cmd])
        )
        return img.digest
    _run_redacted(cmd, args.creds)
    src_tls = ["--tls-verify=false"] if (args.insecure or args.insecure_tls) else []
    src_creds = ["--creds", args.creds] if args.creds else []
    raw = _run_redacted(
        [skopeo, "inspect", "--raw", *src_tls, *src_creds, dest], args.creds, capture=True
    ).stdout
    digest = "sha256:" + sha256_text(raw)
    if digest != img.digest:
        raise BundleError(f"{dest}: registry holds {digest}, the bundle says {img.digest}")
    log(f"pushed {dest}@{digest}")
    return digest


def push_chart(helm: str, chart: Path, registry: str, args: argparse.Namespace) -> None:
    cmd = [helm, "push", str(chart), f"oci://{registry}/{args.chart_repo}"]
    if args.insecure:
        cmd.append("--plain-http")
    if args.insecure_tls:
        cmd.append("--insecure-skip-tls-verify")
    shown = list(cmd)
    if args.creds:
        user, _, password = args.creds.partition(":")
        cmd += ["--username", user, "--password", password]
        shown += ["--username", user, "--password", "***"]
    if args.dry_run:
        print("DRY-RUN " + shlex.join(shown))
        return
    _run_redacted(cmd, args.creds and args.creds.partition(":")[2])
    log(f"pushed {chart.name} to oci://{registry}/{args.chart_repo}")


def helm_install_line(
    manifest: dict, images: list[ImageEntry], registry: str, args: argparse.Namespace
) -> str:
    chart = manifest["chart"]
    by_name = {i.name: i for i in images}
    parts = [
        "helm",
        "install",
        args.release,
        f"oci://{registry}/{args.chart_repo}/{chart['name']}",
        "--version",
        chart["version"],
        "--namespace",
        args.namespace,
        "--create-namespace",
        "--set",
        f"global.imageRegistry={registry}",
    ]
    if "kdbl/kdbl" in by_name:
        parts += ["--set", f"image.digest={by_name['kdbl/kdbl'].digest}"]
    if args.model_volume == "image" and "kdbl/kdbl-model" in by_name:
        parts += [
            "--set",
            "embedder.volume.type=image",
            "--set",
            f"embedder.volume.image.digest={by_name['kdbl/kdbl-model'].digest}",
        ]
    chat = manifest.get("chat_model")
    if chat:  # the answer tool's chat model, shipped beside the embedding model (build_bundle.py --chat-model)
        parts += ["--set", chat["chart_value"]]
    if args.insecure:
        parts.append("--plain-http")
    if args.insecure_tls:
        parts.append("--insecure-skip-tls-verify")
    return " ".join(shlex.quote(p) for p in parts)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("bundle", type=Path, help="bundle directory or .tar")
    ap.add_argument("--registry", help="private registry host[:port][/path] (required unless --verify-only)")
    tls = ap.add_mutually_exclusive_group()
    tls.add_argument("--insecure", action="store_true", help="plain HTTP registry (loopback/test registries)")
    tls.add_argument("--insecure-tls", action="store_true", help="HTTPS without certificate verification")
    ap.add_argument(
        "--creds",
        help="USER:PASSWORD for the registry (or log in beforehand: skopeo login / helm registry login)",
    )
    ap.add_argument(
        "--dry-run", action="store_true", help="verify, then print the push commands without running them"
    )
    ap.add_argument("--verify-only", action="store_true", help="only check SHA256SUMS")
    ap.add_argument("--skip-images", action="store_true", help="do not push images")
    ap.add_argument("--skip-chart", action="store_true", help="do not push the chart")
    ap.add_argument(
        "--chart-repo",
        default="charts",
        help="repository path of the chart under the registry (default charts)",
    )
    ap.add_argument("--release", default="kdbl", help="release name in the printed helm line (default kdbl)")
    ap.add_argument("--namespace", default="kdbl", help="namespace in the printed helm line (default kdbl)")
    ap.add_argument(
        "--model-volume",
        choices=("pvc", "image"),
        default="pvc",
        help="embedding model source in the printed helm line: the chart's default PVC kdbl-models, "
        "or the kdbl/kdbl-model image as an image volume (Kubernetes >= 1.33)",
    )
    ap.add_argument(
        "--extract-to", type=Path, help="where to unpack a .tar bundle (default: a temporary directory)"
    )
    ap.add_argument("--skopeo", help="skopeo binary")
    ap.add_argument("--helm", help="helm binary")
    args = ap.parse_args(argv)
    if not args.verify_only and not args.registry:
        ap.error("--registry is required (or --verify-only)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tmp: tempfile.TemporaryDirectory[str] | None = None
    try:
        bundle = args.bundle
        if bundle.is_file():
            if args.extract_to:
                args.extract_to.mkdir(parents=True, exist_ok=True)
                root = extract_tar(bundle, args.extract_to)
            else:
                tmp = tempfile.TemporaryDirectory(prefix="kdbl-bundle-")
                root = extract_tar(bundle, Path(tmp.name))
        elif bundle.is_dir():
            root = bundle
        else:
            raise BundleError(f"{bundle}: no such bundle directory or tar")
        report = require_verified(root)
        manifest = read_manifest(root)
        images = read_images_txt(root)
        log(
            f"verified {report.checked} files of {manifest['name']} {manifest['version']} "
            f"(commit {manifest['source']['commit'][:12]}, built {manifest['build_date']})"
        )
        for img in images:
            if not (root / img.archive).is_file():
                raise BundleError(f"images.txt names {img.archive}, which is not in the bundle")
        if args.verify_only:
            print(f"OK: {root} matches SHA256SUMS ({report.checked} files)")
            return 0

        registry = registry_host(args.registry)
        if not args.skip_images and images:
            skopeo = find_tool("skopeo", args.skopeo)
            for img in images:
                push_image(skopeo, root, img, registry, args)
        elif not images:
            log("this bundle holds no images (built with --skip-images)")
        chart_file = root / manifest["chart"]["file"]
        if not args.skip_chart:
            helm = find_tool("helm", args.helm)
            push_chart(helm, chart_file, registry, args)

        print()
        print("# Loaded. Create the Secret(s) first (docs/operations/install-offline.md), then:")
        print(helm_install_line(manifest, images, registry, args))
        if args.model_volume == "pvc":
            model = manifest.get("model", {}).get("file", "model/<file>.gguf")
            print(
                f"# The embedder reads /models from PVC 'kdbl-models' by default: copy {model} into it, or add"
            )
            print(
                "#   --set embedder.volume.type=image (Kubernetes >= 1.33; rerun with --model-volume image for the digest),"
            )
            print("#   or --set embedder.enabled=false for lexical search only.")
        for ext in manifest.get("external_images", []):
            print(f"# Not in the bundle: {ext['ref']} ({ext['values']}) - {ext['note']}")
        return 0
    except BundleError as exc:
        log(f"ERROR: {exc}")
        return 1
    finally:
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())
