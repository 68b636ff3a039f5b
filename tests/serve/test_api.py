"""The OpenAI API of ``tilepilot serve``, driven by the official ``openai`` client against a real server."""

from __future__ import annotations

import json
import urllib.request

import pytest

CHAT = [{"role": "user", "content": "Tell me about the sea."}]
PROMPT = "The quick brown fox"


def figures(obj) -> dict:
    """The ``tilepilot`` extension field (an extra field on the client's pydantic models)."""
    fig = (obj.model_extra or {}).get("tilepilot")
    assert fig is not None, "every response carries the tilepilot figures"
    return fig


def assert_labelled_figures(fig: dict, decode_steps: bool) -> None:
    assert fig["modeled_ttft_s"] > 0
    assert fig["measured_host_s"] > 0 and fig["measured_queue_s"] >= 0
    if decode_steps:
        assert fig["modeled_decode_tok_s"] > 0
    assert "modeled" in fig["note"] and "measured" in fig["note"]
    # the CPU groups' wall clock, reported beside the modeled figures (which hold their modeled cost instead)
    assert fig["ttft_cpu_measured_s"] >= 0
    if decode_steps:
        assert fig["decode_cpu_measured_s_per_token"] >= 0


def stream_chat(client, model_id, **kw):
    chunks = list(client.chat.completions.create(model=model_id, messages=CHAT, stream=True, **kw))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return chunks, text


def test_models_and_health(client, model_id, server, serve_model_dir):
    assert model_id == serve_model_dir.name
    card = client.models.retrieve(model_id)
    assert card.id == model_id and card.model_extra["context_length"] == 32768
    health = server.health()
    assert health["status"] == "ok" and health["model"] == model_id


def test_chat_completion_with_usage_and_figures(client, model_id, tokenizer):
    r = client.chat.completions.create(model=model_id, messages=CHAT, max_tokens=6, temperature=0)
    choice = r.choices[0]
    assert r.object == "chat.completion" and choice.message.role == "assistant"
    assert choice.finish_reason == "length" and choice.message.content
    assert r.usage.prompt_tokens == len(tokenizer.encode_chat(CHAT))
    assert r.usage.completion_tokens == 6 and r.usage.total_tokens == r.usage.prompt_tokens + 6
    assert_labelled_figures(figures(r), decode_steps=True)


def test_streamed_chat_equals_non_streamed_for_greedy(client, model_id):
    full = client.chat.completions.create(model=model_id, messages=CHAT, max_tokens=8, temperature=0)
    chunks, text = stream_chat(client, model_id, max_tokens=8, temperature=0, stream_options={"include_usage": True})
    assert text == full.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == "length"
    assert_labelled_figures(figures(finals[0]), decode_steps=True)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8  # the include_usage chunk
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens


def test_raw_stream_is_sse_ending_with_done(server, model_id):
    body = json.dumps({"model": model_id, "prompt": PROMPT, "max_tokens": 3, "temperature": 0, "stream": True})
    req = urllib.request.Request(
        f"{server.base_url}/completions", data=body.encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        events = [line for line in r.read().decode().split("\n\n") if line]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    last = json.loads(events[-2][len("data: ") :])
    assert last["object"] == "text_completion" and last["choices"][0]["finish_reason"] == "length"
    assert last["tilepilot"]["modeled_ttft_s"] > 0


def test_a_request_that_names_no_model_gets_the_one_served(server, model_id):
    """``model`` is optional, as on vLLM's and llama.cpp's servers: one model is served here."""
    body = json.dumps({"messages": CHAT, "max_tokens": 2, "temperature": 0})
    req = urllib.request.Request(
        f"{server.base_url}/chat/completions", data=body.encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        reply = json.loads(r.read())
    assert reply["model"] == model_id and reply["choices"][0]["message"]["role"] == "assistant"


def test_completion_streamed_equals_non_streamed_with_usage(client, model_id, tokenizer):
    full = client.completions.create(model=model_id, prompt=PROMPT, max_tokens=7, temperature=0)
    assert full.object == "text_completion" and full.choices[0].finish_reason == "length"
    assert full.usage.prompt_tokens == len(tokenizer.encode(PROMPT, add_bos=True))
    assert full.usage.completion_tokens == 7
    assert_labelled_figures(figures(full), decode_steps=True)
    chunks = list(client.completions.create(model=model_id, prompt=PROMPT, max_tokens=7, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == full.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"
    assert_labelled_figures(figures(chunks[-1]), decode_steps=True)


def test_completion_accepts_token_ids(client, model_id, tokenizer):
    ids = tokenizer.encode(PROMPT, add_bos=True)
    by_ids = client.completions.create(model=model_id, prompt=ids, max_tokens=5, temperature=0)
    by_text = client.completions.create(model=model_id, prompt=PROMPT, max_tokens=5, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text
    assert by_ids.usage.prompt_tokens == len(ids)


@pytest.mark.parametrize("stream", [False, True])
def test_stop_sequence_cuts_the_text_before_it(client, model_id, stream):
    free = client.completions.create(model=model_id, prompt=PROMPT, max_tokens=12, temperature=0).choices[0].text
    assert len(free) >= 6
    stop = free[len(free) // 2 : len(free) // 2 + 2]
    cut = free[: free.find(stop)]
    kw = dict(model=model_id, prompt=PROMPT, max_tokens=12, temperature=0, stop=[stop, "never-appears-here"])
    if stream:
        chunks = list(client.completions.create(stream=True, **kw))
        text, reason = "".join(c.choices[0].text for c in chunks), chunks[-1].choices[0].finish_reason
    else:
        r = client.completions.create(**kw)
        text, reason = r.choices[0].text, r.choices[0].finish_reason
        assert r.usage.completion_tokens < 12
    assert (text, reason) == (cut, "stop")


def test_seeded_sampling_is_reproducible(client, model_id):
    kw = dict(model=model_id, prompt=PROMPT, max_tokens=6, temperature=1.0, top_p=0.9)
    a = client.completions.create(seed=11, **kw).choices[0].text
    b = client.completions.create(seed=11, **kw).choices[0].text
    assert a == b


def test_multi_turn_chat_reuses_the_kv_cache_and_answers_as_a_cold_run(client, model_id):
    first = client.chat.completions.create(model=model_id, messages=CHAT, max_tokens=5, temperature=0)
    turn2 = [*CHAT, {"role": "assistant", "content": first.choices[0].message.content}]
    turn2.append({"role": "user", "content": "And the mountains?"})
    warm = client.chat.completions.create(model=model_id, messages=turn2, max_tokens=5, temperature=0)
    cached = warm.usage.prompt_tokens_details.cached_tokens
    assert cached == figures(warm)["cached_prompt_tokens"]
    assert cached >= first.usage.prompt_tokens  # at least the whole first prompt came from the cache
    client.completions.create(model=model_id, prompt=[7, 8, 9], max_tokens=1, temperature=0)  # no shared prefix
    cold = client.chat.completions.create(model=model_id, messages=turn2, max_tokens=5, temperature=0)
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    assert warm.choices[0].message.content == cold.choices[0].message.content
    npu = [figures(r)["modeled_ttft_s"] for r in (warm, cold)]
    assert npu[0] <= npu[1]  # the modeled (load-independent) TTFT of a shorter prefill is no longer


def test_a_prompt_that_diverges_from_the_cache_keeps_only_the_shared_rows(client, model_id, tokenizer):
    shared = tokenizer.encode("A long shared beginning of two prompts,", add_bos=True)
    a, b = [*shared, *tokenizer.encode(" then one way")], [*shared, *tokenizer.encode(" and another")]
    client.completions.create(model=model_id, prompt=a, max_tokens=4, temperature=0)
    warm = client.completions.create(model=model_id, prompt=b, max_tokens=4, temperature=0)
    assert warm.usage.prompt_tokens_details.cached_tokens == len(shared)  # rows past the fork were dropped
    client.completions.create(model=model_id, prompt=[7, 8, 9], max_tokens=1, temperature=0)
    cold = client.completions.create(model=model_id, prompt=b, max_tokens=4, temperature=0)
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    assert warm.choices[0].text == cold.choices[0].text
