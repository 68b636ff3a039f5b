"""Concurrency, disconnects and shutdown: the server queues requests, frees the runner, and exits cleanly."""

from __future__ import annotations

import http.client
import json
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

LONG = 2000  # tokens: ~1 minute of host time on this model, far beyond any timeout below


def open_stream(server, model_id: str, max_tokens: int = LONG) -> tuple[http.client.HTTPConnection, object]:
    """Start a long streaming completion and return once its first text chunk has arrived."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    body = {"model": model_id, "prompt": "Once upon a time", "max_tokens": max_tokens, "temperature": 0, "stream": True}
    conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    line = resp.readline()
    while not line.startswith(b"data: "):
        line = resp.readline()
    return conn, resp


def test_sixteen_concurrent_clients_get_the_answers_they_get_alone(client, model_id):
    prompts = [f"Question number {i}: what is {i} plus {i}?" for i in range(4)]

    def ask(i: int):
        if i % 2:
            r = client.completions.create(model=model_id, prompt=prompts[i % 4], max_tokens=4, temperature=0)
            return r.choices[0].text, r.choices[0].finish_reason, r.usage.completion_tokens
        msgs = [{"role": "user", "content": prompts[i % 4]}]
        r = client.chat.completions.create(model=model_id, messages=msgs, max_tokens=4, temperature=0)
        return r.choices[0].message.content, r.choices[0].finish_reason, r.usage.completion_tokens

    alone = {i: ask(i) for i in range(8)}  # one of each (endpoint, prompt) pair, served with nobody waiting
    with ThreadPoolExecutor(16) as pool:
        together = list(pool.map(ask, range(16), timeout=120))
    for i, answer in enumerate(together):
        assert answer == alone[i % 8], f"request {i} differs when served among 16"
        assert answer[1] == "length" and answer[2] == 4


def test_disconnect_mid_stream_frees_the_runner(server, client, model_id):
    conn, resp = open_stream(server, model_id)
    assert server.health()["busy"]
    resp.close()  # the client goes away after its first chunk (the response holds the socket too)
    conn.close()
    t0 = time.monotonic()
    r = client.completions.create(model=model_id, prompt="next", max_tokens=3, temperature=0, timeout=20)
    assert r.usage.completion_tokens == 3
    assert time.monotonic() - t0 < 20  # served long before the abandoned 2000-token generation could finish
    assert not server.health()["busy"]


def test_non_streaming_client_that_gives_up_frees_the_runner(server, client, model_id):
    impatient = openai.OpenAI(base_url=server.base_url, api_key="unused", timeout=1.5, max_retries=0)
    try:
        impatient.completions.create(model=model_id, prompt="A long story", max_tokens=LONG, temperature=0)
    except openai.APITimeoutError:
        pass
    else:
        raise AssertionError("a 2000-token completion cannot finish within 1.5 s here")
    r = client.completions.create(model=model_id, prompt="next", max_tokens=2, temperature=0, timeout=20)
    assert r.usage.completion_tokens == 2


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_shutdown_signal_during_a_generation_exits_0_within_seconds(launch, sig):
    server = launch()
    conn, resp = open_stream(server, server.health()["model"])
    tail: list[bytes] = []
    reader = threading.Thread(target=lambda: tail.append(resp.read()), daemon=True)
    reader.start()
    t0 = time.monotonic()
    server.proc.send_signal(sig)
    assert server.proc.wait(timeout=15) == 0
    assert time.monotonic() - t0 < 10
    reader.join(timeout=5)
    conn.close()
    assert tail and b"shutting down" in tail[0] and tail[0].rstrip().endswith(b"data: [DONE]")
