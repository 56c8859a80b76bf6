"""The bundle's chat-model slot (issue 17): build_bundle.py --chat-model ships a site-supplied GGUF for the
answer tool beside the embedding model (never downloaded), and install_bundle.py's helm line points the
chart's api.chatModel.path at it."""

from __future__ import annotations

import argparse
from pathlib import Path

import build_bundle  # airgap/ is on sys.path (tests/airgap/conftest.py)
import bundlelib
import install_bundle
import pytest
from chat_model import build_chat_model


def test_a_gguf_chat_model_goes_into_model_with_its_sha256_and_chart_value(tmp_path: Path) -> None:
    src = build_chat_model(tmp_path / "tiny-chat.gguf")
    info = build_bundle.add_chat_model(src, tmp_path / "bundle" / "model", sha256=bundlelib.sha256_file(src))
    assert info == {"file": "model/tiny-chat.gguf", "sha256": bundlelib.sha256_file(src), "bytes": src.stat().st_size,
                    "chart_value": "api.chatModel.path=/models/tiny-chat.gguf"}
    assert (tmp_path / "bundle" / info["file"]).read_bytes() == src.read_bytes()
    args = build_bundle.parse_args(["--chat-model", str(src), "--chat-model-sha256", info["sha256"]])
    assert args.chat_model == src and args.chat_model_sha256 == info["sha256"]


def test_a_file_that_is_no_gguf_or_has_another_sha256_is_refused(tmp_path: Path) -> None:
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_bytes(b"<html>a login page</html>")
    with pytest.raises(bundlelib.BundleError, match="not a GGUF"):
        build_bundle.add_chat_model(not_gguf, tmp_path / "out")
    real = build_chat_model(tmp_path / "chat.gguf")
    with pytest.raises(bundlelib.BundleError, match="does not match"):
        build_bundle.add_chat_model(real, tmp_path / "out", sha256="0" * 64)
    with pytest.raises(bundlelib.BundleError, match="no such file"):
        build_bundle.add_chat_model(tmp_path / "missing.gguf", tmp_path / "out")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_the_install_line_sets_the_chat_model_path_only_when_the_bundle_has_one() -> None:
    args = argparse.Namespace(release="kdbl", chart_repo="charts", namespace="kdbl", model_volume="pvc",
                              insecure=False, insecure_tls=False)
    manifest = {"chart": {"name": "kdbl", "version": "0.1.0"}}
    plain = install_bundle.helm_install_line(manifest, [], "registry.local:5000", args)
    with_chat = install_bundle.helm_install_line(
        {**manifest, "chat_model": {"chart_value": "api.chatModel.path=/models/chat.gguf"}}, [],
        "registry.local:5000", args)
    assert "chatModel" not in plain
    assert with_chat.endswith("--set api.chatModel.path=/models/chat.gguf")
