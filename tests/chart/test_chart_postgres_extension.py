"""The bundled PostgreSQL loads K-Lake's kdbl_bm25 extension from the kdbl image: an initContainer copies
/opt/kdbl/pgext into an emptyDir, postgres mounts it read-only and starts with the options
kdbl_core.db.pgext.server_options gives for that directory (postgres.bundled.kdblExtension)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from chart_helpers import Chart, one
from kdbl_core.db.pgext import server_options

EXT_DIR = "/kdbl-pgext"
REGISTRY = "registry.local:5000"
DIGEST = "sha256:" + "cd" * 32


def _pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return one(docs, "StatefulSet", "kdbl-postgres")["spec"]["template"]["spec"]


def _bundled(chart: Chart, *extra: str) -> dict[str, Any]:
    return _pod(chart.render_variant("bundled-postgres", *extra))


def test_an_init_container_copies_the_extension_from_the_kdbl_image_into_an_empty_dir(chart: Chart) -> None:
    pod = _bundled(chart)
    [init] = pod["initContainers"]
    assert init["name"] == "kdbl-extension"
    assert init["image"] == "kdbl/kdbl:0.1.0"
    script = init["command"][-1]
    assert init["command"][:2] == ["sh", "-c"]
    assert f"cp -R /opt/kdbl/pgext/lib /opt/kdbl/pgext/share {EXT_DIR}/" in script
    mounts = {m["name"]: m for m in init["volumeMounts"]}
    assert mounts["kdbl-pgext"]["mountPath"] == EXT_DIR and not mounts["kdbl-pgext"].get("readOnly")
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes["kdbl-pgext"]


def test_the_init_container_follows_the_kdbl_image_s_registry_digest_and_pull_policy(chart: Chart) -> None:
    pod = _bundled(
        chart,
        "--set", f"global.imageRegistry={REGISTRY}",
        "--set", f"image.digest={DIGEST}",
        "--set", "image.pullPolicy=Always",
    )  # fmt: skip
    [init] = pod["initContainers"]
    assert init["image"] == f"{REGISTRY}/kdbl/kdbl@{DIGEST}"
    assert init["imagePullPolicy"] == "Always"


def test_postgres_mounts_the_copy_read_only_and_starts_with_the_server_options_for_it(chart: Chart) -> None:
    pod = _bundled(chart)
    postgres = next(c for c in pod["containers"] if c["name"] == "postgres")
    assert postgres["args"] == ["postgres", *server_options(Path(EXT_DIR))]
    assert postgres["args"][1:] == [
        "-c", "extension_control_path=$system:/kdbl-pgext/share",
        "-c", "dynamic_library_path=$libdir:/kdbl-pgext/lib",
    ]  # fmt: skip
    assert "command" not in postgres, "the image's entrypoint (initdb, auth setup) must still run"
    mount = next(m for m in postgres["volumeMounts"] if m["name"] == "kdbl-pgext")
    assert mount == {"name": "kdbl-pgext", "mountPath": EXT_DIR, "readOnly": True}


def test_the_init_container_is_as_restricted_as_every_other_container(chart: Chart) -> None:
    pod = _bundled(chart)
    [init] = pod["initContainers"]
    postgres = next(c for c in pod["containers"] if c["name"] == "postgres")
    assert init["securityContext"] == postgres["securityContext"]
    assert init["securityContext"]["readOnlyRootFilesystem"] is True
    assert init["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert init["resources"] == {
        "requests": {"cpu": "10m", "memory": "16Mi"},
        "limits": {"cpu": "200m", "memory": "64Mi"},
    }


def test_the_init_container_fails_with_what_to_change_when_the_image_has_no_extension(
    chart: Chart, tmp_path: Path
) -> None:
    script = _bundled(chart)["initContainers"][0]["command"][-1]
    # run the rendered script with the image's paths moved under tmp_path: an image without the files
    image, out = tmp_path / "image", tmp_path / "out"
    out.mkdir()
    local = script.replace("/opt/kdbl/pgext", str(image)).replace(EXT_DIR, str(out))
    failed = subprocess.run(["sh", "-c", local], capture_output=True, text=True)
    assert failed.returncode == 1
    assert "postgres.bundled.kdblExtension.enabled=false" in failed.stderr
    # and an image with them: both directories are copied
    (image / "lib").mkdir(parents=True)
    (image / "share" / "extension").mkdir(parents=True)
    (image / "lib" / "kdbl_bm25.so").write_bytes(b"\x7fELF")
    (image / "share" / "extension" / "kdbl_bm25.control").write_text("default_version = '1.0'\n")
    copied = subprocess.run(["sh", "-c", local], capture_output=True, text=True)
    assert copied.returncode == 0, copied.stderr
    assert (out / "lib" / "kdbl_bm25.so").read_bytes() == b"\x7fELF"
    assert (out / "share" / "extension" / "kdbl_bm25.control").is_file()


def test_the_value_turns_the_extension_off_and_postgres_starts_as_the_image_does(chart: Chart) -> None:
    pod = _bundled(chart, "--set", "postgres.bundled.kdblExtension.enabled=false")
    assert "initContainers" not in pod
    postgres = next(c for c in pod["containers"] if c["name"] == "postgres")
    assert "args" not in postgres and "command" not in postgres
    assert all(m["name"] != "kdbl-pgext" for m in postgres["volumeMounts"])
    assert all(v["name"] != "kdbl-pgext" for v in pod["volumes"])


def test_without_the_bundled_postgres_nothing_of_it_is_rendered(chart: Chart) -> None:
    result = chart.template()
    assert result.returncode == 0, result.stderr
    assert "kdbl-pgext" not in result.stdout and "kdbl-extension" not in result.stdout
