"""Images a careless or hostile client sends a vision model, over HTTP v2 (tritonclient) and gRPC:
an image's declared size is bounded before it is decoded, and decoding never holds the loop."""

from __future__ import annotations

import base64
import io
import json
import struct
import threading
import urllib.request
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from gateway.app import build_app
from gateway.config import Settings
from tests.grpc.conftest import GRPC_PREFIX, client
from tests.local.conftest import http, wait_ready
from tests.local.test_tensor_model import channel_means_model
from tests.support.servers import ServerThread


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    path = tmp_path_factory.mktemp("models") / "means.onnx"
    channel_means_model(path)
    vision = {"kind": "onnxruntime", "model": str(path), "task": "tensor",
              "providers": ["CPUExecutionProvider"], "served_name": "vision",
              "preprocess": {"kind": "image", "size": [16, 16]}}  # fmt: skip
    cfg = {
        "listeners": [
            {"name": "main", "host": "127.0.0.1", "port": 0},
            {"name": "grpc", "protocol": "grpc", "host": "127.0.0.1", "port": 0},
        ],
        "backends": {"vision": vision},
        "routes": [
            {"name": "vision", "match": {"prefix": "/v2/models/vision"}, "protocol": "v2",
             "backend": "vision"},
            {"name": "grpc-vision", "match": {"prefix": GRPC_PREFIX}, "protocol": "grpc",
             "backend": "vision"},
        ],
    }  # fmt: skip
    server = ServerThread(lambda: build_app(Settings.model_validate(cfg))).start()
    wait_ready(server.url)
    yield server
    server.stop()


def _png(width: int, height: int, rows: int | None = None) -> bytes:
    """An RGB PNG of black pixels declaring width x height; `rows` of them actually encoded
    (a header is all a size check needs to read)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    z = zlib.compressobj(9)
    line = b"\x00" * (1 + 3 * width)
    idat = b"".join(z.compress(line) for _ in range(height if rows is None else rows))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", idat + z.flush()) + chunk(b"IEND", b""))  # fmt: skip


def _images(mod: Any, images: list[bytes]) -> Any:
    inp = mod.InferInput("pixel_values", [len(images)], "BYTES")
    inp.set_data_from_numpy(np.asarray(images, dtype=object))
    return inp


@pytest.mark.parametrize(
    ("width", "height"),
    [(40_000, 40_000), (6_000, 6_000)],
    ids=["past-pillows-own-limit", "past-max-pixels"],
)
def test_an_image_declaring_too_many_pixels_is_refused_before_it_is_decoded(
    gw: ServerThread, width: int, height: int
) -> None:
    """A 1.6 G pixel PNG of a few hundred bytes was a 500 (Pillow's DecompressionBombError) and
    UNKNOWN over gRPC; a 36 M pixel one was decoded (~4 bytes a pixel, seconds of CPU)."""
    bomb = _png(width, height, rows=8)
    with pytest.raises(InferenceServerException) as over_http:
        httpclient.InferenceServerClient(gw.url.removeprefix("http://")).infer(
            "vision", [_images(httpclient, [bomb])]
        )
    assert over_http.value.status() == "400"
    assert "more pixels than the limit of 32000000 (preprocess.max_pixels)" in str(
        over_http.value.message()
    )
    with pytest.raises(InferenceServerException) as over_grpc:
        client(gw).infer("vision", [_images(grpcclient, [bomb])])
    assert over_grpc.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "preprocess.max_pixels" in str(over_grpc.value.message())


def test_an_undecodable_image_names_no_python_object(gw: ServerThread) -> None:
    status, doc = http(
        "POST",
        f"{gw.url}/v2/models/vision/infer",
        {"inputs": [{"name": "pixel_values", "datatype": "BYTES", "shape": [1],
                     "data": ["not an image"]}]},
    )  # fmt: skip
    assert status == 400
    assert doc["error"] == "image could not be decoded: cannot identify image file"


def test_an_image_sent_as_base64_or_a_url_is_a_400_saying_what_to_send(gw: ServerThread) -> None:
    """A BYTES element is the file's bytes: base64 and URLs are not decoded, and no URL is
    fetched (a server-side request to wherever a client points). The 400 said only that Pillow
    could not identify the file, naming a Python object."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    fetched: list[str] = []

    class Picture(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            fetched.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.end_headers()
            self.wfile.write(_png(4, 4))

    site = ThreadingHTTPServer(("127.0.0.1", 0), Picture)
    threading.Thread(target=site.serve_forever, daemon=True).start()
    try:
        png64 = base64.b64encode(_png(4, 4)).decode()
        cases = {
            f"http://127.0.0.1:{site.server_port}/cat.png": "not a URL",
            f"data:image/png;base64,{png64}": "not a URL",
            png64: "not base64",
            base64.encodebytes(_png(4, 4)).decode().replace("+", "-"): "not base64",
        }
        for element, says in cases.items():
            status, doc = http(
                "POST",
                f"{gw.url}/v2/models/vision/infer",
                {"inputs": [{"name": "pixel_values", "datatype": "BYTES", "shape": [1],
                             "data": [element]}]},
            )  # fmt: skip
            assert status == 400, doc
            assert doc["error"].startswith("image could not be decoded: cannot identify image")
            assert says in doc["error"], doc
    finally:
        site.shutdown()
        site.server_close()
    assert fetched == []


def test_a_16_bit_greyscale_image_is_read_as_its_8_bit_twin(gw: ServerThread) -> None:
    """Pillow takes 16-bit greyscale to 8 bits by clipping at 255: a mid-grey 16-bit scan was
    answered as a white image."""
    from PIL import Image

    def encoded(img: Any) -> bytes:
        buf = io.BytesIO()
        img.save(buf, format="PNG")
        return buf.getvalue()

    grey16 = encoded(Image.new("I;16", (20, 20), 128 * 257))
    grey8 = encoded(Image.new("L", (20, 20), 128))
    c = httpclient.InferenceServerClient(gw.url.removeprefix("http://"))
    got = c.infer("vision", [_images(httpclient, [grey16, grey8])]).as_numpy("channel_means")
    np.testing.assert_array_equal(got[0], got[1])


def test_healthz_answers_while_large_images_decode(gw: ServerThread) -> None:
    """Decoding ran on the event loop: eight 31 M pixel PNGs (90 KB each) held every other
    request, /healthz included, for the seconds it took to decode all eight."""
    images = [_png(5_600, 5_600)] * 8
    blob = b"".join(struct.pack("<I", len(i)) + i for i in images)
    tensor = {"name": "pixel_values", "datatype": "BYTES", "shape": [len(images)],
              "parameters": {"binary_data_size": len(blob)}}  # fmt: skip
    header = json.dumps({"inputs": [tensor]}).encode()
    request = urllib.request.Request(
        f"{gw.url}/v2/models/vision/infer", data=header + blob, method="POST",
        headers={"Content-Type": "application/octet-stream",
                 "Inference-Header-Content-Length": str(len(header))},
    )  # fmt: skip
    result: dict[str, Any] = {}

    def infer() -> None:
        with urllib.request.urlopen(request, timeout=300) as resp:
            result["doc"] = json.loads(resp.read())

    worker = threading.Thread(target=infer)
    worker.start()
    # counted from the moment the gateway has the request
    while worker.is_alive() and "latentgate_in_flight_requests 1.0" not in _metrics(gw):
        pass
    answered_during = 0
    while worker.is_alive():
        status, _ = http("GET", f"{gw.url}/healthz")
        assert status == 200
        if worker.is_alive():
            answered_during += 1
    worker.join()
    assert result["doc"]["outputs"][0]["shape"] == [8, 3]
    # not only the few that land while its body is read, before the first image is decoded
    assert answered_during >= 10


def _metrics(gw: ServerThread) -> str:
    _, text = http("GET", f"{gw.url}/metrics")
    return str(text)
