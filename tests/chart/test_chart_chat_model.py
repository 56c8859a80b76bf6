"""The chart's chat model for the `answer` tool (issue 17): unset by default (no KDBL_CHAT_* env: extractive
answers only); api.chatModel.path sets the API's KDBL_CHAT_* settings, and the file must lie in the models
volume the embedding model is mounted from (the airgap bundle ships both there)."""

from __future__ import annotations

from typing import Any

from chart_helpers import Chart, env_of, pod_templates

from kdbl_core.settings import Settings

CHAT = "/models/qwen2.5-1.5b-instruct-q4_k_m.gguf"


def _env(docs: list[dict[str, Any]], component: str) -> dict[str, dict[str, Any]]:
    [container] = next(p for p in pod_templates(docs) if p.component == component).spec["containers"][:1]
    return env_of(container)


def test_no_chat_model_by_default(chart: Chart) -> None:
    assert not [name for name in _env(chart.render(), "api") if name.startswith("KDBL_CHAT")]


def test_a_chat_model_path_reaches_the_api_as_settings_and_not_the_worker(chart: Chart) -> None:
    docs = chart.render("--set", f"api.chatModel.path={CHAT}", "--set", "api.chatModel.timeoutSeconds=30")
    env = {name: item["value"] for name, item in _env(docs, "api").items() if name.startswith("KDBL_CHAT")}
    assert env == {"KDBL_CHAT_MODEL_PATH": CHAT, "KDBL_CHAT_CTX": "4096", "KDBL_CHAT_THREADS": "2",
                   "KDBL_CHAT_TIMEOUT_S": "30"}
    settings = Settings(**{name.removeprefix("KDBL_").lower(): value for name, value in env.items()})
    assert settings.chat_model_path == CHAT and settings.chat_timeout_s == 30  # each name is a setting
    assert not [name for name in _env(docs, "worker") if name.startswith("KDBL_CHAT")]


def test_a_chat_model_outside_the_models_volume_is_refused(chart: Chart) -> None:
    elsewhere = chart.template("--set", "api.chatModel.path=/opt/chat.gguf")
    assert elsewhere.returncode != 0 and "models volume's directory /models" in elsewhere.stderr
    without = chart.template("--set", f"api.chatModel.path={CHAT}", "--set", "embedder.enabled=false")
    assert without.returncode != 0 and "api.chatModel.path needs the models volume" in without.stderr
    not_gguf = chart.template("--set", "api.chatModel.path=/models/chat.bin")
    assert not_gguf.returncode != 0 and "path" in not_gguf.stderr
