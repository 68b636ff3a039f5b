"""``tilepilot serve`` on the whole trained SmolLM2-135M-Instruct answers an ``openai`` client's chat question about the
capital of France with Paris (issue 15, "done when").

All 30 layers are needed for a right answer (a truncated model babbles), and deploying them through the eight phases
takes minutes, so the server runs on a workspace of the full model with the built-in default plan (what
``make_workspace`` writes, as the other serve tests do): the same runner, kernels and bf16 numerics, without the
phases' optimizations. The deployed workspace's answers are recorded by ``benchmarks/real_models.py``. The question is
README (a)'s, whose answer is the same under float64, fp32 and bf16 row sums. Two phrasings start on near ties of the
first answer token's bf16 logits, so a bf16 ulp decides them: "What is the capital of France?" (see
benchmarks/results/real_models.md), and "Which city is the capital of France?", which this test asked until the
attention family's default tiling became the modeled fastest (its key blocks, and so the production path's
rounding, changed: the default plan then answered "Le Grand Chateau, also known as the City of Light, ...").
"""

from __future__ import annotations

import pytest
from serve_helpers import start_server, stop_server

from tilepilot.model.tokenizer import Tokenizer
from tilepilot.runtime.workspace import make_workspace

QUESTION = "Name the capital city of France."
TIMEOUT_S = 300.0  # 30 layers on a shared 2-core machine


@pytest.fixture(scope="module")
def trained(smollm2_dir, tmp_path_factory):
    model = smollm2_dir(None)  # the whole model (one import per session, shared with tests/model)
    ws = make_workspace(model, "default", tmp_path_factory.mktemp("trained-serve") / "ws").path
    server = start_server(ws, model, tmp_path_factory.mktemp("trained-serve-log") / "server.log")
    yield server
    stop_server(server)


def test_trained_model_served_answers_paris(trained):
    import openai

    client = openai.OpenAI(base_url=trained.base_url, api_key="unused", timeout=TIMEOUT_S, max_retries=0)
    model_id = client.models.list().data[0].id
    assert model_id == "SmolLM2-135M-Instruct.Q4_1"  # the GGUF file's name, as llama.cpp's server names it
    messages = [{"role": "user", "content": QUESTION}]
    ask = {"model": model_id, "messages": messages, "max_tokens": 24, "temperature": 0}
    reply = client.chat.completions.create(**ask)
    text = reply.choices[0].message.content
    assert "Paris" in text, text
    assert reply.choices[0].finish_reason == "stop", text  # the model ended its turn (<|im_end|>), not the budget
    tok = Tokenizer.from_dir(trained.model_dir)
    assert reply.usage.prompt_tokens == len(tok.encode_chat(messages))  # the checkpoint's own chat template
    chunks = client.chat.completions.create(**ask, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text
