"""A local model served as tensors (classifiers, rerankers, vision): v2 inputs checked against the
engine's own specs, optional image preprocessing, requests batched along dimension 0.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import numpy as np
from numpy.typing import NDArray

from backends.batcher import Batcher
from backends.errors import BadInput
from backends.local.engine import Engine, TensorSpec
from backends.local.metrics import LocalMetrics
from backends.preprocess.cpu import decode_image, images_to_nchw
from backends.settings import BatcherSettings, ImagePreprocess

Feeds = dict[str, NDArray[Any]]
log = logging.getLogger("latentgate.local")


class TensorModel:
    def __init__(
        self,
        name: str,
        engine: Engine,
        batching: BatcherSettings,
        image: ImagePreprocess | None = None,
        metrics: LocalMetrics | None = None,
    ) -> None:
        self.name = name
        self.engine = engine
        self.device = engine.device
        self.providers = engine.providers
        self.image = image
        self.outputs = engine.outputs
        for spec in (*engine.inputs, *engine.outputs):
            spec.numpy_dtype()  # (EngineError at load for a datatype no request could use)
        # With image preprocessing, clients send encoded images as one BYTES tensor.
        self.inputs = (
            [TensorSpec(engine.inputs[0].name, "BYTES", (-1,))] if image else list(engine.inputs)
        )
        self._gpu: Any = None
        if image is not None and engine.device == "cuda":
            from backends.preprocess.gpu import GpuPreprocessor, cuda_available

            # Decode on the host, resize and normalise on the device the engine reads from.
            self._gpu = GpuPreprocessor() if cuda_available() else None
        # Requests share an engine run only when the graph takes any number of rows on dimension
        # 0 of every input and gives one row per input row on every output: a fixed batch size
        # (e.g. [1, 3]) or an output without that dimension (a scalar) runs each request alone.
        self.joinable = all(s.shape and s.shape[0] == -1 for s in engine.inputs) and all(
            s.shape and s.shape[0] == -1 for s in engine.outputs
        )
        # Off for a graph whose rows depend on each other (dynamic quantization), and cleared
        # the first time a shared run's outputs are not one row per input row: the graph's
        # dimension 0 is then not (only) the batch. Either way requests run one by one.
        self._joins = self.joinable and engine.batch_invariant
        self._batcher: Batcher[Feeds, Feeds | Exception] = Batcher(
            name, self._run_batch, batching, metrics=metrics
        )
        self.ready = False

    async def acheck(self, inputs: dict[str, tuple[str, list[int], Any]]) -> Feeds:
        """Client tensors → engine feeds; BadInput names the tensor and what does not fit.

        Images are decoded in a worker thread, one at a time: on the loop, a request of large
        images held every other request (and /healthz) for seconds, and a request whose client
        has gone (its task cancelled) stops at its next image instead of decoding the rest."""
        feeds: Feeds = {}
        for spec, shape, value in self._checked(inputs):
            if self.image is None and spec.datatype == "BYTES":
                feeds[spec.name] = _strings(spec.name, shape, value)
            elif self.image is None:
                feeds[spec.name] = np.asarray(value, spec.numpy_dtype())
            elif self._gpu is not None:
                gpu = self._gpu.images_to_nchw
                feeds[spec.name] = await asyncio.to_thread(gpu, value, self.image)
            else:
                rows = [await asyncio.to_thread(decode_image, b, self.image) for b in value]
                feeds[spec.name] = np.stack(rows) if rows else images_to_nchw([], self.image)
        return feeds

    def _checked(
        self, inputs: dict[str, tuple[str, list[int], Any]]
    ) -> list[tuple[TensorSpec, list[int], Any]]:
        """The model's inputs with the client's values, once names, datatypes and shapes fit."""
        want = {s.name: s for s in self.inputs}
        for name in inputs:
            if name not in want:
                raise BadInput(
                    f"model {self.name} has no input '{name}' (it takes {', '.join(want)})"
                )
        missing = [s.name for s in self.inputs if s.name not in inputs]
        if missing:  # (before the rows check below reads them all)
            raise BadInput(f"model {self.name} needs input '{missing[0]}'")
        out: list[tuple[TensorSpec, list[int], Any]] = []
        for spec in self.inputs:
            datatype, shape, value = inputs[spec.name]
            if datatype != spec.datatype:
                raise BadInput(f"input '{spec.name}' must be {spec.datatype}, got {datatype}")
            if len(shape) != len(spec.shape) or any(
                w not in (-1, g) for w, g in zip(spec.shape, shape, strict=True)
            ):
                raise BadInput(
                    f"input '{spec.name}' has shape {shape}; the model takes {list(spec.shape)} "
                    "(-1: any size)"
                )
            rows = {s.name: inputs[s.name][1][0] for s in self.inputs if inputs[s.name][1]}
            if len(set(rows.values())) > 1 and self.joinable:
                raise BadInput(
                    f"model {self.name}'s inputs must agree on dimension 0 (rows): got "
                    + ", ".join(f"{k} {v}" for k, v in rows.items())
                )
            if self.image is not None and not value:
                # (a graph run on no rows: the CPU path answered an empty result and the GPU
                # path's torch.stack of nothing raised, a 500; neither is what was asked)
                raise BadInput(f"input '{spec.name}' holds no images; send at least one")
            out.append((spec, shape, value))
        return out

    def run(self, feeds: Feeds) -> Feeds:
        return self.engine.run(feeds)

    async def arun(self, feeds: Feeds) -> Feeds:
        out = (await self._batcher.submit([feeds]))[0]
        if isinstance(out, Exception):
            raise out  # this request's own failure (its batch mates were answered)
        return out

    def warmup(self) -> None:
        feeds = {}
        for spec in self.engine.inputs:
            shape = [1 if d < 0 else d for d in spec.shape]
            dtype = spec.numpy_dtype()
            # ("0" for a string: the text a model that parses its strings also reads)
            feeds[spec.name] = np.full(shape, "0" if spec.datatype == "BYTES" else 0, dtype)
        self.engine.run(feeds)
        self.ready = True

    def _run_batch(self, batch: list[Feeds]) -> list[Feeds | Exception]:
        """Requests whose non-batch shapes agree share one engine run; the rest run alone. A
        shared run that fails is run again request by request: one request's failure is its
        own, never its batch mates'."""
        out: list[Feeds | Exception] = [{} for _ in batch]
        groups: dict[tuple[Any, ...], list[int]] = {}
        for i, feeds in enumerate(batch):
            key: tuple[Any, ...] = (
                tuple((k, v.shape[1:]) for k, v in sorted(feeds.items())) if self._joins else (i,)
            )
            groups.setdefault(key, []).append(i)
        for idx in groups.values():
            if len(idx) == 1:
                out[idx[0]] = self._alone(batch[idx[0]])
                continue
            names = batch[idx[0]].keys()
            joined = {n: _concat([batch[i][n] for i in idx]) for n in names}
            rows = [len(next(iter(batch[i].values()))) for i in idx]
            result: Feeds | None
            try:
                result = self.engine.run(joined)
            except Exception:
                result = None
            # A dynamic dimension 0 is not always the batch: a flattened output, or one row per
            # detection, holds another count, and slicing it by request would hand one request
            # its neighbour's values, cut to its own length.
            if result is not None and any(
                tuple(v.shape[:1]) != (sum(rows),) for v in result.values()
            ):
                log.warning("model %s: an output is not one row per input row; "
                            "requests now run one at a time", self.name)  # fmt: skip
                self._joins, result = False, None
            if result is None:
                for i in idx:
                    out[i] = self._alone(batch[i])
                continue
            start = 0
            for i, n in zip(idx, rows, strict=True):
                out[i] = {k: v[start : start + n] for k, v in result.items()}
                start += n
        return out

    def _alone(self, feeds: Feeds) -> Feeds | Exception:
        try:
            return self.engine.run(feeds)
        except Exception as exc:
            return exc

    async def aclose(self) -> None:
        await self._batcher.aclose()
        self.engine.close()


def _strings(name: str, shape: list[int], elements: list[bytes]) -> NDArray[Any]:
    """A BYTES tensor for a string input: UTF-8 text, as ONNX Runtime reads string tensors."""
    out = np.empty(len(elements), object)
    try:
        out[:] = [e.decode() for e in elements]
    except UnicodeDecodeError:
        raise BadInput(f"input '{name}' must hold UTF-8 strings") from None
    return out.reshape(shape)


def _concat(parts: list[Any]) -> Any:
    """numpy arrays on the host; torch CUDA tensors (GPU preprocessing) stay on the device."""
    if getattr(parts[0], "is_cuda", False):
        import torch

        return torch.cat(parts)
    return np.concatenate(parts)
