"""The worker's GPU offload (issue 29): off by default (no GPU request, no KDBL_EMBED_GPU_LAYERS);
worker.gpu.enabled requests the device plugin's resource and sets the llama.cpp layers as a setting."""

from __future__ import annotations

from typing import Any

from chart_helpers import Chart, env_of, pod_templates

from kdbl_core.settings import Settings


def _worker(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return next(p for p in pod_templates(docs) if p.component == "worker").spec["containers"][0]


def test_no_gpu_by_default(chart: Chart) -> None:
    worker = _worker(chart.render())
    assert "KDBL_EMBED_GPU_LAYERS" not in env_of(worker)
    assert not [r for r in worker["resources"].get("limits", {}) if "gpu" in r]


def test_gpu_offload_requests_the_device_and_sets_the_layers(chart: Chart) -> None:
    worker = _worker(chart.render("--set", "worker.gpu.enabled=true", "--set", "worker.gpu.layers=12",
                                  "--set", "worker.gpu.resource=amd.com/gpu"))
    layers = env_of(worker)["KDBL_EMBED_GPU_LAYERS"]["value"]
    assert Settings(embed_gpu_layers=layers).embed_gpu_layers == 12  # a setting the worker reads
    limits = worker["resources"]["limits"]
    assert limits["amd.com/gpu"] == 1 and limits["memory"] == "2Gi" and limits["cpu"] == "2"  # kept
    refused = chart.template("--set", "worker.gpu.enabled=true", "--set", "worker.gpu.layers=-2")
    assert refused.returncode != 0 and "layers" in refused.stderr
