"""Preprocessing: images to NCHW on the CPU, the same tensors on a GPU (where one is present)."""

from __future__ import annotations

import io

import numpy as np
import pytest

from backends.errors import BadInput
from backends.preprocess.cpu import Tokens, decode_image, images_to_nchw, pad_tokens
from backends.preprocess.gpu import IMAGE_TOLERANCE, cuda_available
from backends.settings import ImagePreprocess

needs_cuda = pytest.mark.skipif(not cuda_available(), reason="no CUDA device visible to torch")


def png(width: int, height: int, seed: int = 0) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(seed)
    img = Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def test_image_becomes_normalised_nchw() -> None:
    spec = ImagePreprocess(size=(32, 48))
    out = images_to_nchw([png(64, 40), png(20, 20, 1)], spec)
    assert out.shape == (2, 3, 32, 48) and out.dtype == np.float32
    # A uniform white image normalises to (1 - mean) / std per channel.
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (10, 10), (255, 255, 255)).save(buf, format="PNG")
    white = decode_image(buf.getvalue(), spec)
    expected = (1 - np.array(spec.mean)) / np.array(spec.std)
    assert np.allclose(white.mean(axis=(1, 2)), expected, atol=1e-5)


def test_undecodable_image_is_bad_input() -> None:
    with pytest.raises(BadInput, match="image could not be decoded"):
        decode_image(b"definitely not a picture", ImagePreprocess())


def test_oversized_image_is_bad_input() -> None:
    with pytest.raises(BadInput, match="exceeds the limit of 10"):
        decode_image(png(8, 8), ImagePreprocess(max_bytes=10))


def test_no_images_is_bad_input() -> None:
    with pytest.raises(BadInput, match="no images"):
        images_to_nchw([], ImagePreprocess())


def test_pad_tokens_masks_the_padding() -> None:
    batch = [Tokens(np.array([101, 7, 102]), np.zeros(3, np.int64)),
             Tokens(np.array([101, 102]), np.zeros(2, np.int64))]  # fmt: skip
    feeds = pad_tokens(batch)
    assert feeds["input_ids"].tolist() == [[101, 7, 102], [101, 102, 0]]
    assert feeds["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]


@needs_cuda
@pytest.mark.gpu
def test_gpu_tokens_equal_cpu_tokens() -> None:
    from backends.preprocess.gpu import GpuPreprocessor

    batch = [Tokens(np.arange(1, n + 1), np.zeros(n, np.int64)) for n in (5, 2, 9)]
    gpu = GpuPreprocessor().pad_tokens(batch)
    for name, value in pad_tokens(batch).items():
        assert np.array_equal(GpuPreprocessor.to_numpy(gpu[name]), value), name


@needs_cuda
@pytest.mark.gpu
def test_gpu_images_match_cpu_within_tolerance() -> None:
    from backends.preprocess.gpu import GpuPreprocessor

    spec = ImagePreprocess(size=(32, 32))
    images = [png(64, 64, s) for s in range(3)]
    cpu = images_to_nchw(images, spec)
    gpu = GpuPreprocessor.to_numpy(GpuPreprocessor().images_to_nchw(images, spec))
    std = np.array(spec.std, np.float32)[None, :, None, None]
    # Compare in [0, 1] pixel units: the stated tolerance is per value before normalisation.
    assert np.abs((cpu - gpu) * std).mean() < IMAGE_TOLERANCE


@needs_cuda
@pytest.mark.gpu
def test_gpu_no_images_is_bad_input() -> None:
    from backends.preprocess.gpu import GpuPreprocessor

    with pytest.raises(BadInput, match="no images"):
        GpuPreprocessor().images_to_nchw([], ImagePreprocess())
