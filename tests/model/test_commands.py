"""`tilepilot zoo` and `tilepilot inspect` through the real CLI entry point: output, JSON and exit codes."""

import json

import pytest

from tilepilot.cli import main
from tilepilot.model.zoo import ZOO


def test_zoo_list_table_and_json(capsys):
    assert main(["zoo", "list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ZOO) and "GiB" in out
    assert main(["zoo", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    llama = next(r for r in rows if r["name"] == "llama-3.2-1b")
    assert llama["layers"] == 16 and llama["hidden"] == 2048 and llama["bf16_bytes"] == 2 * llama["params"]


def test_zoo_make_then_inspect(tmp_path, capsys):
    out = tmp_path / "m"
    assert main(["zoo", "make", "QWEN2.5-0.5B", "--layers", "1", "--out", str(out), "--seed", "3"]) == 0
    assert "measured" in capsys.readouterr().out
    assert main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert "Qwen2ForCausalLM" in text and "in scope" in text and "tokenizer" in text
    assert main(["inspect", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["spec"]["n_layers"] == 1 and report["weights"]["dtypes"] == {"BF16": 14}
    assert report["tokenizer"]["eos_ids"] == [151643] and report["tokenizer"]["chat_template"] is True
    # the output directory is never overwritten
    assert main(["zoo", "make", "qwen2.5-0.5b", "--layers", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "not empty" in err and err.count("\n") == 1
    # a damaged weight file is reported by inspect in one sentence, from the header alone
    f = out / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-1000])
    assert main(["inspect", str(out)]) == 2
    err = capsys.readouterr().err
    assert "truncated" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["zoo", "make", "gpt2", "--out", "x"], "unknown zoo model 'gpt2'"),
        (["inspect", "/nonexistent/model"], "does not exist"),
    ],
)
def test_bad_arguments_exit_nonzero_with_one_sentence(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1
