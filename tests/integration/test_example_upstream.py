"""The README's example upstream (`make upstream` = `python -m tests.support.upstream`): one
command gives the chat example a model server; it reads every v2 datatype (BOOL included) and
answers a request it cannot read with a 400, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import numpy as np
import openai
import pytest
import tritonclient.http as httpclient

from tests.conftest import base_config
from tests.support.servers import ROOT, ServerThread, free_port, wait_port


@pytest.fixture
def example_upstream() -> Iterator[tuple[str, subprocess.Popen[str]]]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.upstream", "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_port("127.0.0.1", port, 30)
        yield f"http://127.0.0.1:{port}", proc
    finally:
        proc.terminate()
        proc.wait(10)
        assert proc.stdout is not None
        proc.stdout.close()


def test_the_readme_chat_example_works_against_the_example_upstream(
    example_upstream: tuple[str, subprocess.Popen[str]],
    start_gateway: Callable[..., ServerThread],
) -> None:
    url, proc = example_upstream
    gw = start_gateway(base_config(url))
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="sk-example", max_retries=0)
    try:
        answer = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], temperature=0
        )
    finally:
        client.close()
    assert answer.choices[0].message.content == "echo(up): hi"

    triton = httpclient.InferenceServerClient(gw.url.removeprefix("http://"))
    try:
        flags = httpclient.InferInput("INPUT0", [3], "BOOL")
        flags.set_data_from_numpy(np.array([True, False, True]))
        got = triton.infer("m", [flags]).as_numpy("OUTPUT0")
        assert got is not None and got.tolist() == [True, False, True]
    finally:
        triton.close()
    # A datatype it does not read: Triton's 400 {"error": ...}, passed through verbatim.
    bad = {"inputs": [{"name": "INPUT0", "datatype": "BF16", "shape": [1], "data": [1.0]}]}
    req = urllib.request.Request(
        f"{gw.url}/v2/models/m/infer", data=json.dumps(bad).encode(), method="POST"
    )
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    assert err.value.code == 400
    assert "unsupported datatype BF16" in json.loads(err.value.read())["error"]
    err.value.close()
    proc.terminate()
    out, _ = proc.communicate(timeout=10)
    assert "example upstream 'up' on " + url in out
    assert "Traceback" not in out and "KeyError" not in out
