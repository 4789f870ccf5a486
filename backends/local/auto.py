"""Execution provider choice: TensorRT, then CUDA, then CPU, whichever this onnxruntime offers."""

from __future__ import annotations

import logging

PREFERENCE = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]

log = logging.getLogger("latentgate.local")


def available_providers() -> list[str]:
    import onnxruntime as ort

    return list(ort.get_available_providers())


def choose_providers(wanted: str | list[str]) -> list[str]:
    """`auto` → every preferred provider this build has; a list is kept in order, filtered."""
    have = available_providers()
    asked = PREFERENCE if wanted == "auto" else list(wanted)
    picked = [p for p in asked if p in have]
    missing = [p for p in asked if p not in have]
    if missing and wanted != "auto":
        log.warning("onnxruntime has no %s here (it has %s)", ", ".join(missing), ", ".join(have))
    elif missing and picked and picked[0] == "CPUExecutionProvider":
        # The engine's one device line says it too (backends.local.onnx): details at debug.
        log.debug(
            "providers auto: no %s in this onnxruntime build; falling back to the CPU",
            " or ".join(missing),
        )
    if "CPUExecutionProvider" not in picked:
        picked.append("CPUExecutionProvider")  # ORT's own last resort; keep it explicit
    return picked


def device_of(providers: list[str]) -> str:
    return "cuda" if providers and providers[0] != "CPUExecutionProvider" else "cpu"
