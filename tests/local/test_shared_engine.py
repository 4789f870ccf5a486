"""EngineShare: holders of one model share one session; the last release closes it."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from backends.local.engine import TensorSpec
from backends.local.shared import EngineShare


class CountingEngine:
    """A real (tiny) Engine implementation that records its lifecycle."""

    def __init__(self) -> None:
        self.name, self.device, self.providers = "m", "cpu", ["CPUExecutionProvider"]
        self.inputs = [TensorSpec("x", "FP32", (-1,))]
        self.outputs = [TensorSpec("y", "FP32", (-1,))]
        self.batch_invariant = True
        self.closed = 0

    def run(self, feeds: dict[str, NDArray[Any]]) -> dict[str, NDArray[Any]]:
        return {"y": feeds["x"] * 2}

    def close(self) -> None:
        self.closed += 1


def test_one_build_per_key_and_the_last_release_closes() -> None:
    share, built = EngineShare(), []

    def build() -> CountingEngine:
        built.append(CountingEngine())
        return built[-1]

    a, b = share.acquire("k", build), share.acquire("k", build)
    other = share.acquire("other", build)
    assert len(built) == 2 and a.inner is b.inner and other.inner is not a.inner
    np.testing.assert_array_equal(b.run({"x": np.ones(2, np.float32)})["y"], [2, 2])
    a.close()
    a.close()  # a holder closing twice releases once
    assert built[0].closed == 0 and len(share) == 2
    b.close()
    assert built[0].closed == 1 and len(share) == 1
    # After the last release the next holder gets a fresh session.
    c = share.acquire("k", build)
    assert len(built) == 3 and c.inner is built[2]
