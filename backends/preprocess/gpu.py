"""Preprocessing on a CUDA device with torch/torchvision (imported lazily, only when asked for).

Same results as backends/preprocess/cpu.py within a stated tolerance: token tensors are equal,
images differ by under 2/255 on average before normalisation (resize kernels differ slightly).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from backends.errors import BadInput
from backends.preprocess.cpu import Tokens, open_image
from backends.settings import ImagePreprocess

IMAGE_TOLERANCE = 2.0 / 255.0


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


class GpuPreprocessor:
    """Pads, buckets and normalises on the device; results stay device tensors until `to_numpy`."""

    device = "cuda"

    def __init__(self, device: str = "cuda:0") -> None:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA device is visible to torch")
        self._torch = torch
        self._device = torch.device(device)

    def pad_tokens(self, batch: Sequence[Tokens], to: int | None = None) -> dict[str, Any]:
        torch = self._torch
        width = max(len(t.ids) for t in batch) if to is None else to
        lengths = torch.tensor([len(t.ids) for t in batch], device=self._device)
        flat = torch.from_numpy(np.concatenate([t.ids for t in batch])).to(self._device)
        flat_types = torch.from_numpy(np.concatenate([t.type_ids for t in batch])).to(self._device)
        # One scatter on the device instead of a Python loop of row copies.
        cols = torch.arange(width, device=self._device)
        mask = (cols[None, :] < lengths[:, None]).to(torch.int64)
        ids = torch.zeros((len(batch), width), dtype=torch.int64, device=self._device)
        types = torch.zeros_like(ids)
        ids[mask.bool()] = flat
        types[mask.bool()] = flat_types
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}

    def images_to_nchw(self, images: Sequence[bytes], spec: ImagePreprocess) -> Any:
        torch = self._torch
        from torchvision.io import ImageReadMode, decode_image
        from torchvision.transforms.v2 import functional as F

        if not images:  # (torch.stack of nothing raises RuntimeError)
            raise BadInput("no images to preprocess; send at least one")
        out = []
        for i, data in enumerate(images):
            # max_bytes and max_pixels from the header, before torchvision decodes a pixel
            # (Pillow reads only the header; what it cannot read the CPU path refuses too)
            open_image(data, spec).close()
            try:
                raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
                img = decode_image(raw, mode=ImageReadMode.RGB)
            except (RuntimeError, ValueError) as exc:
                raise BadInput(f"image[{i}] could not be decoded: {exc}") from None
            # torchvision gives a 16-bit PNG as uint16: its full scale is 65535, not 255
            full = 255.0 if img.dtype == torch.uint8 else 65535.0
            img = img.to(self._device, non_blocking=True).float() / full
            img = F.resize(img, list(spec.size), antialias=True)  # PIL antialiases too
            out.append(F.normalize(img, list(spec.mean), list(spec.std)))
        return torch.stack(out)

    @staticmethod
    def to_numpy(tensor: Any) -> NDArray[Any]:
        return np.asarray(tensor.detach().cpu().numpy())
