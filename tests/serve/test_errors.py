"""Bad requests get a 4xx status and an OpenAI error body naming the problem; the server keeps serving."""

from __future__ import annotations

import http.client
import json

import openai
import pytest

CHAT = [{"role": "user", "content": "hi"}]


def raw(server, path: str, body: bytes, content_type: str | None = "application/json", method: str = "POST"):
    """A request the openai client would never send (bad JSON, wrong content type), over plain http.client."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    headers = {"Content-Type": content_type} if content_type else {}
    conn.request(method, path, body=body, headers=headers)
    r = conn.getresponse()
    status, data = r.status, json.loads(r.read())
    conn.close()
    return status, data


def error_of(exc: openai.APIStatusError) -> dict:
    err = exc.body if isinstance(exc.body, dict) else {}
    return err.get("error", err)  # the client may unwrap the "error" object


def assert_error_shape(err: dict) -> None:
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]


def test_unknown_model_is_404_and_names_the_served_one(client, model_id):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-7", messages=CHAT, max_tokens=2)
    err = error_of(e.value)
    assert_error_shape(err)
    assert err["code"] == "model_not_found" and err["param"] == "model"
    assert "gpt-7" in err["message"] and model_id in err["message"]


@pytest.mark.parametrize(
    ("kwargs", "param", "words"),
    [
        ({"temperature": 5}, "temperature", "less than or equal to 2"),
        ({"top_p": 0}, "top_p", "greater than 0"),
        ({"max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
        ({"n": 3}, "n", "one sequence per request"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4 stop sequences"),
        ({"presence_penalty": 0.5}, "presence_penalty", "not implemented"),
    ],
)
def test_parameters_out_of_range_are_400_naming_the_parameter(client, model_id, kwargs, param, words):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model_id, messages=CHAT, **kwargs)
    err = error_of(e.value)
    assert_error_shape(err)
    assert err["param"] == param and param in err["message"] and words in err["message"]


def test_empty_messages_and_empty_prompt_are_400(client, model_id):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model_id, messages=[])
    assert error_of(e.value)["param"] == "messages"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model_id, prompt="")
    assert "empty" in error_of(e.value)["message"]


def test_prompt_longer_than_the_context_is_400(client, model_id):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model_id, prompt=[5] * 32769, max_tokens=1)
    err = error_of(e.value)
    assert err["code"] == "context_length_exceeded" and "32769" in err["message"] and "32768" in err["message"]
    with pytest.raises(openai.BadRequestError) as e:  # the prompt fits, prompt + max_tokens does not
        client.chat.completions.create(model=model_id, messages=CHAT, max_tokens=40000)
    err = error_of(e.value)
    assert err["code"] == "context_length_exceeded" and "max_tokens 40000" in err["message"]


def test_token_ids_outside_the_vocabulary_are_400(client, model_id):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model_id, prompt=[1, 10**9], max_tokens=1)
    assert "outside the vocabulary" in error_of(e.value)["message"]


def test_malformed_json_wrong_content_type_and_non_objects(server, model_id):
    status, body = raw(server, "/v1/chat/completions", b'{"model": "x", "messages": [')
    assert status == 400 and body["error"]["code"] == "invalid_json"
    assert_error_shape(body["error"])
    status, body = raw(server, "/v1/chat/completions", json.dumps({"model": model_id}).encode(), "text/plain")
    assert status == 415 and "application/json" in body["error"]["message"]
    status, body = raw(server, "/v1/completions", b"[1, 2, 3]")
    assert status == 400 and "JSON object" in body["error"]["message"]
    status, body = raw(server, "/v1/completions", b"\xff\xfe not utf-8")
    assert status == 400 and body["error"]["code"] == "invalid_json"
    status, body = raw(server, "/v1/completions", json.dumps({"model": model_id}).encode())
    assert status == 400 and body["error"]["param"] == "prompt" and "Field required" in body["error"]["message"]


def test_unknown_route_and_wrong_method_have_openai_error_bodies(server):
    status, body = raw(server, "/v1/engines", b"", method="GET")
    assert status == 404 and body["error"]["code"] == "not_found"
    status, body = raw(server, "/v1/chat/completions", b"", method="GET")
    assert status == 405 and body["error"]["code"] == "method_not_allowed"


def test_server_still_serves_after_bad_requests(client, model_id, server):
    raw(server, "/v1/completions", b"{{{{")
    r = client.completions.create(model=model_id, prompt="still alive?", max_tokens=2, temperature=0)
    assert r.usage.completion_tokens == 2
    assert server.health()["status"] == "ok"
