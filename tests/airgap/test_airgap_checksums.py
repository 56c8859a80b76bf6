"""SHA256SUMS: install_bundle.py refuses a bundle with any mismatched, missing or unlisted file,
before it pushes anything. Also the pure helpers (wheel tags, images.txt, tar extraction)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import bundlelib
import pytest
from airgap_testlib import run_install, write_minimal_bundle


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    return write_minimal_bundle(tmp_path / "bundle")


def test_intact_bundle_verifies(bundle: Path) -> None:
    proc = run_install(bundle, "--verify-only")
    assert proc.returncode == 0, proc.stderr
    assert "matches SHA256SUMS" in proc.stdout
    # the file is sha256sum -c compatible
    lines = (bundle / "SHA256SUMS").read_text().splitlines()
    assert all(len(ln.split("  ", 1)[0]) == 64 for ln in lines)
    assert "MANIFEST.json" in {ln.split("  ", 1)[1] for ln in lines}


def test_tampered_file_fails(bundle: Path) -> None:
    model = bundle / "model" / "all-minilm-l6-v2.f16.gguf"
    data = bytearray(model.read_bytes())
    data[100] ^= 0x01
    model.write_bytes(bytes(data))
    proc = run_install(bundle, "--verify-only")
    assert proc.returncode == 1
    assert "FAILED verification" in proc.stderr
    assert "MISMATCH: model/all-minilm-l6-v2.f16.gguf" in proc.stderr


def test_tampered_bundle_pushes_nothing(bundle: Path) -> None:
    (bundle / "charts" / "kdbl-0.1.0.tgz").write_bytes(b"evil")
    # an unreachable registry: verification must fail first, so nothing is even attempted
    proc = run_install(bundle, "--registry", "127.0.0.1:9", "--insecure")
    assert proc.returncode == 1
    assert "MISMATCH: charts/kdbl-0.1.0.tgz" in proc.stderr
    assert "skopeo" not in proc.stderr and "helm push" not in proc.stderr


def test_extra_file_fails(bundle: Path) -> None:
    (bundle / "wheels" / "injected-0.1-py3-none-any.whl").write_bytes(b"PK")
    proc = run_install(bundle, "--verify-only")
    assert proc.returncode == 1
    assert "EXTRA: wheels/injected-0.1-py3-none-any.whl" in proc.stderr


def test_missing_file_fails(bundle: Path) -> None:
    (bundle / "sbom" / "wheels.spdx.json").unlink()
    proc = run_install(bundle, "--verify-only")
    assert proc.returncode == 1
    assert "MISSING: sbom/wheels.spdx.json" in proc.stderr


def test_missing_sums_file_fails(bundle: Path) -> None:
    (bundle / "SHA256SUMS").unlink()
    proc = run_install(bundle, "--verify-only")
    assert proc.returncode == 1
    assert "SHA256SUMS" in proc.stderr and "missing" in proc.stderr


@pytest.mark.parametrize(
    "line",
    [
        "nothex  model/x",
        "0" * 64 + "  ../etc/passwd",
        "0" * 64 + "  /etc/passwd",
    ],
)
def test_malformed_or_unsafe_sums_line_fails(bundle: Path, line: str) -> None:
    with open(bundle / "SHA256SUMS", "a") as f:
        f.write(line + "\n")
    proc = run_install(bundle, "--verify-only")
    assert proc.returncode == 1
    assert "malformed" in proc.stderr or "unsafe path" in proc.stderr


def test_symlink_in_bundle_fails(bundle: Path) -> None:
    (bundle / "wheels" / "link.whl").symlink_to("/etc/passwd")
    proc = run_install(bundle, "--verify-only")
    assert proc.returncode == 1
    assert "plain files" in proc.stderr


def test_tar_bundle_verifies_and_tampered_tar_fails(bundle: Path, tmp_path: Path) -> None:
    from build_bundle import write_tar

    tar = write_tar(bundle)
    assert tar.with_name(tar.name + ".sha256").read_text().split()[0] == bundlelib.sha256_file(tar)
    proc = run_install(tar, "--verify-only")
    assert proc.returncode == 0, proc.stderr

    # same tar with one member's content changed
    bad = tmp_path / "bad.tar"
    with tarfile.open(tar) as src, tarfile.open(bad, "w") as dst:
        for m in src.getmembers():
            data = src.extractfile(m).read() if m.isfile() else None
            if m.name.endswith(".gguf"):
                data = b"X" + data[1:]
            dst.addfile(m, io.BytesIO(data) if data is not None else None)
    proc = run_install(bad, "--verify-only")
    assert proc.returncode == 1
    assert "MISMATCH: model/all-minilm-l6-v2.f16.gguf" in proc.stderr


def test_tar_with_unsafe_member_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "evil.tar"
    with tarfile.open(bad, "w") as tf:
        info = tarfile.TarInfo("bundle/../../escape")
        info.size = 1
        tf.addfile(info, io.BytesIO(b"x"))
    proc = run_install(bad, "--verify-only")
    assert proc.returncode == 1
    assert "refusing member" in proc.stderr


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("numpy-2.4.6-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl", True),
        ("cryptography-50.0.2-cp311-abi3-manylinux_2_34_x86_64.whl", True),
        ("argon2_cffi_bindings-26.2.0-cp310-abi3-manylinux_2_26_x86_64.whl", True),
        ("psutil-7.2.2-cp36-abi3-manylinux2010_x86_64.manylinux_2_12_x86_64.whl", True),
        ("llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl", True),
        ("defusedxml-0.7.1-py2.py3-none-any.whl", True),
        ("numpy-2.4.6-cp312-cp312-manylinux_2_27_x86_64.whl", False),
        ("numpy-2.4.6-cp311-cp311-musllinux_1_2_x86_64.whl", False),
        ("numpy-2.4.6-cp311-cp311-manylinux_2_39_x86_64.whl", False),
        ("numpy-2.4.6-cp311-cp311-manylinux_2_28_aarch64.whl", False),
        ("numpy-2.4.6-cp311-cp311-macosx_14_0_x86_64.whl", False),
        ("cryptography-50.0.2-cp312-abi3-manylinux_2_34_x86_64.whl", False),
    ],
)
def test_wheel_target_tags(name: str, ok: bool) -> None:
    assert bundlelib.wheel_fits_target(name) is ok


def test_images_txt_round_trip_and_errors(tmp_path: Path) -> None:
    entry = bundlelib.ImageEntry("kdbl/kdbl", "0.1.0", "sha256:" + "a" * 64, "images/kdbl_kdbl-0.1.0.oci.tar")
    bundlelib.write_images_txt(tmp_path, [entry], comments=["note"])
    assert bundlelib.read_images_txt(tmp_path) == [entry]
    for bad in (
        "kdbl/kdbl sha256:" + "a" * 64 + " images/x.tar",  # no tag
        "kdbl/kdbl:1 md5:abc images/x.tar",
        "kdbl/kdbl:1 sha256:" + "a" * 64 + " ../x.tar",
    ):
        (tmp_path / "images.txt").write_text(bad + "\n")
        with pytest.raises(bundlelib.BundleError):
            bundlelib.read_images_txt(tmp_path)
