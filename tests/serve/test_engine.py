"""The engine in process: a bounded FIFO queue, and ``stop`` that frees the runner at the next token."""

from __future__ import annotations

import queue

import pytest

from tilepilot.serve.engine import Engine, Failed, Finished, GenerationParams, ServerBusy, ShuttingDown, TextDelta


def test_full_queue_refuses_and_stop_cancels_the_running_and_fails_the_waiting(serve_workspace):
    engine = Engine.from_workspace(serve_workspace, max_queue=1)
    ids = engine.prompt_ids("Once upon a time")
    running, waiting = queue.Queue(), queue.Queue()
    engine.submit(ids, GenerationParams(max_tokens=2000), running.put)
    assert isinstance(running.get(timeout=30), TextDelta)  # the first job is generating
    engine.submit(ids, GenerationParams(max_tokens=4), waiting.put)
    with pytest.raises(ServerBusy, match="1 requests are already waiting"):
        engine.submit(ids, GenerationParams(max_tokens=4), waiting.put)
    engine.stop()
    failed = waiting.get(timeout=5)
    assert isinstance(failed, Failed) and isinstance(failed.error, ShuttingDown)
    while not isinstance(ev := running.get(timeout=5), Finished):
        pass
    assert ev.finish_reason == "cancelled" and ev.completion_tokens < 2000
    engine.join(timeout=5)
    assert engine._thread is not None and not engine._thread.is_alive()
    with pytest.raises(ShuttingDown):
        engine.submit(ids, GenerationParams(max_tokens=1), waiting.put)
