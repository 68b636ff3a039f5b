"""The zoo: the nine supported models with their published configs, and a writer of random-weight checkpoints.

No weights can be downloaded here, so tests, demos and benchmarks run on checkpoints tilepilot writes
itself: the exact published ``config.json`` of each model (full size, or with fewer layers), a real
byte-level BPE tokenizer with the family's special tokens at the config's ids, and random weights
(``zoo_weights``) chosen so that greedy decoding is stable. The writer streams: the safetensors
header first, then each tensor generated and written on its own, so a full-size model never sits in
memory; it writes into ``OUT.tmp-*`` and renames, so an interrupted run leaves no half-written model.

Configs: copied from the ``config.json`` of each Hugging Face repository (the ``meta-llama``,
``HuggingFaceTB`` and ``Qwen`` organisations); see docs/zoo.md for which fields were cross-checked.
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tilepilot.errors import ConfigError
from tilepilot.files import assembled_dir
from tilepilot.model.checkpoint import INDEX_FILE, shard_names
from tilepilot.model.safetensors_io import PlannedTensor, StreamingWriter
from tilepilot.model.spec import ModelSpec, spec_from_config
from tilepilot.model.zoo_tokenizer import LAYOUTS, token_ids, tokenizer_config_json, tokenizer_json
from tilepilot.model.zoo_weights import LiveVocab, WeightScheme, generate_tensor

DEFAULT_SHARD_BYTES = 2 * 1024**3  # Hugging Face's own default shard size for save_pretrained is in this range

DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "float32": torch.float32,
    "fp32": torch.float32,
}
_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}

_LLAMA32 = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 32.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 128256,
}

_SMOLLM2 = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "max_position_embeddings": 8192,
    "mlp_bias": False,
    "model_type": "llama",
    "pad_token_id": 2,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 130000,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 49152,
}

_QWEN25 = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "model_type": "qwen2",
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_mrope": False,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

_QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "max_position_embeddings": 40960,
    "model_type": "qwen3",
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}


def _dims(hidden: int, inter: int, layers: int, heads: int, kv: int, **extra: Any) -> dict[str, Any]:
    return {
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        **extra,
    }


@dataclass(frozen=True)
class ZooModel:
    """One supported model: its name here, its Hugging Face repository, its published config, its tokenizer."""

    name: str
    hf_repo: str
    config: dict[str, Any]
    tokenizer: str  # key of zoo_tokenizer.LAYOUTS

    def spec(self, layers: int | None = None) -> ModelSpec:
        return spec_from_config(self.hf_config(layers), name=self.name)

    def live_vocab(self, vocab: int | None = None) -> LiveVocab:
        """The ids the zoo tokenizer of this model can produce (they get full-size embedding rows)."""
        layout = LAYOUTS[self.tokenizer]
        specials = {i for i, _ in layout.specials}
        ids = token_ids(layout, vocab or self.config["vocab_size"])
        return LiveVocab(
            ordinary=tuple(sorted(i for i in ids.values() if i not in specials)), special=tuple(sorted(specials))
        )

    def hf_config(self, layers: int | None = None, dtype: str = "bfloat16") -> dict[str, Any]:
        """The published config.json, optionally with fewer layers (and the fields that count layers)."""
        cfg = copy.deepcopy(self.config)
        if layers is not None:
            if layers < 1:
                raise ConfigError(f"a zoo model needs at least one layer, got --layers {layers}")
            n = self.config["num_hidden_layers"]
            if layers > n:  # more layers than published would be a made-up model many times the real one's size
                raise ConfigError(
                    f"cannot keep {layers} layers of {self.name}, a {n}-layer model; pass --layers 1..{n}"
                )
            cfg["num_hidden_layers"] = layers
            if "max_window_layers" in cfg:
                cfg["max_window_layers"] = min(cfg["max_window_layers"], layers)
        cfg["torch_dtype"] = dtype
        return cfg


ZOO: dict[str, ZooModel] = {
    m.name: m
    for m in (
        ZooModel(
            "llama-3.2-1b",
            "meta-llama/Llama-3.2-1B",
            {**_LLAMA32, **_dims(2048, 8192, 16, 32, 8, head_dim=64)},
            "llama3",
        ),
        ZooModel(
            "llama-3.2-3b",
            "meta-llama/Llama-3.2-3B",
            {**_LLAMA32, **_dims(3072, 8192, 28, 24, 8, head_dim=128)},
            "llama3",
        ),
        ZooModel(
            "smollm2-1.7b", "HuggingFaceTB/SmolLM2-1.7B", {**_SMOLLM2, **_dims(2048, 8192, 24, 32, 32)}, "smollm2"
        ),
        ZooModel(
            "qwen2.5-0.5b",
            "Qwen/Qwen2.5-0.5B",
            {
                **_QWEN25,
                **_dims(896, 4864, 24, 14, 2),
                "max_position_embeddings": 32768,
                "max_window_layers": 24,
                "sliding_window": 32768,
            },
            "qwen2",
        ),
        ZooModel(
            "qwen2.5-1.5b",
            "Qwen/Qwen2.5-1.5B",
            {
                **_QWEN25,
                **_dims(1536, 8960, 28, 12, 2),
                "max_position_embeddings": 131072,
                "max_window_layers": 28,
                "sliding_window": 131072,
            },
            "qwen2",
        ),
        ZooModel(
            "qwen2.5-3b",
            "Qwen/Qwen2.5-3B",
            {
                **_QWEN25,
                **_dims(2048, 11008, 36, 16, 2),
                "max_position_embeddings": 32768,
                "max_window_layers": 36,
                "sliding_window": 32768,
            },
            "qwen2",
        ),
        ZooModel(
            "qwen3-0.6b",
            "Qwen/Qwen3-0.6B",
            {**_QWEN3, **_dims(1024, 3072, 28, 16, 8), "max_window_layers": 28},
            "qwen3",
        ),
        ZooModel(
            "qwen3-1.7b",
            "Qwen/Qwen3-1.7B",
            {**_QWEN3, **_dims(2048, 6144, 28, 16, 8), "max_window_layers": 28},
            "qwen3",
        ),
        ZooModel(
            "qwen3-4b", "Qwen/Qwen3-4B", {**_QWEN3, **_dims(2560, 9728, 36, 32, 8), "max_window_layers": 36}, "qwen3"
        ),
    )
}


def zoo_names() -> list[str]:
    return list(ZOO)


def get_zoo_model(name: str) -> ZooModel:
    """Look a model up by name, in any case; ConfigError lists the valid names."""
    key = name.strip().lower()
    if key not in ZOO:
        raise ConfigError(f"unknown zoo model {name!r}; choose one of {', '.join(ZOO)}")
    return ZOO[key]


def dtype_from_name(name: str) -> torch.dtype:
    key = name.strip().lower()
    if key not in DTYPES:
        raise ConfigError(f"unsupported dtype {name!r}; use bf16, fp16 or fp32")
    return DTYPES[key]


def plan_shards(spec: ModelSpec, dtype: torch.dtype, shard_bytes: int) -> list[list[PlannedTensor]]:
    """Split the spec's tensors, in file order, into shards of at most ``shard_bytes``.

    A tensor larger than ``shard_bytes`` gets a shard of its own (tensors are never split)."""
    if shard_bytes <= 0:
        raise ConfigError(f"shard size must be positive, got {shard_bytes}")
    shards: list[list[PlannedTensor]] = [[]]
    size = 0
    for name, shape in spec.tensor_shapes().items():
        t = PlannedTensor(name, dtype, tuple(shape))
        if shards[-1] and size + t.nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += t.nbytes
    return shards


ProgressFn = Callable[[str, int], None]  # (tensor name, bytes just written)


def write_zoo_model(
    name: str,
    out_dir: str | Path,
    layers: int | None = None,
    seed: int = 0,
    dtype: str = "bfloat16",
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    progress: ProgressFn | None = None,
    *,
    overrides: dict[str, Any] | None = None,
) -> Path:
    """Write a complete Hugging Face model directory for zoo model ``name`` and return its path.

    The directory must not exist yet (or be empty): the model is assembled next to it and renamed into
    place, so a crash or Ctrl-C never leaves a directory that looks like a model but is not one.
    ``overrides`` replaces config.json fields (e.g. a small ``hidden_size`` for fast tests of the
    writer itself); the result is then no longer the published model.
    """
    model = get_zoo_model(name)
    torch_dtype = dtype_from_name(dtype)
    dtype_name = _DTYPE_NAMES[torch_dtype]
    out = check_out_dir(out_dir)
    cfg = {**model.hf_config(layers, dtype_name), **(overrides or {})}
    spec = spec_from_config(cfg, name=model.name)
    layout = LAYOUTS[model.tokenizer]
    with assembled_dir(out) as tmp:
        write_json(tmp / "config.json", cfg)
        gen = {"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"], "do_sample": False}
        write_json(tmp / "generation_config.json", gen)
        write_json(tmp / "tokenizer.json", tokenizer_json(layout, spec.vocab))
        write_json(tmp / "tokenizer_config.json", tokenizer_config_json(layout, spec.max_positions))
        _write_weights(tmp, spec, torch_dtype, seed, shard_bytes, model.live_vocab(spec.vocab), progress)
    return out


def check_out_dir(out_dir: str | Path) -> Path:
    """The output path, if it is new or an empty directory whose parent can be written; ConfigError otherwise.

    Checked before any work, so a refused --out costs nothing and leaves nothing: the model is assembled in a
    temporary directory beside ``out`` (hence the parent's check) and renamed into place."""
    out = Path(out_dir)
    check_not_a_file(out)
    if out.is_dir() and any(out.iterdir()):
        raise ConfigError(f"{out} already exists and is not empty; choose a new --out directory")
    check_writable(out.parent, out)
    return out


def check_not_a_file(out: Path) -> None:
    """Refuse an --out that exists as something other than a directory (an output directory cannot replace it)."""
    if out.exists() and not out.is_dir():
        what = "a file" if out.is_file() else "not a directory"
        raise ConfigError(f"{out} is {what}, not a directory to write into; choose a new --out directory")


def check_writable(directory: Path, out: Path) -> None:
    """Refuse an --out ``out`` whose files would go into ``directory`` (or the ancestor it would be created in) when
    nothing can be created there. A directory is made and removed at once to find out: permission bits alone say
    nothing about a read-only or virtual file system (/proc), nor about root, whom ``os.access`` never refuses."""
    existing = Path(directory)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"--out {out} cannot be created because {existing} is a file; choose another --out directory")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".tilepilot-probe-", dir=existing))
    except OSError as e:
        raise ConfigError(
            f"--out {out} cannot be written (creating a directory in {existing} fails: {e.strerror}); choose an --out "
            "directory you can write to"
        ) from None


def write_json(path: Path, obj: Any) -> None:
    """A JSON file of a Hugging Face directory being built (in a temp dir that is renamed whole at the end)."""
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _write_weights(
    out: Path,
    spec: ModelSpec,
    dtype: torch.dtype,
    seed: int,
    shard_bytes: int,
    live: LiveVocab,
    progress: ProgressFn | None,
) -> None:
    shards = plan_shards(spec, dtype, shard_bytes)
    files = shard_names(len(shards))
    for fname, plan in zip(files, shards, strict=True):
        with StreamingWriter(out / fname, plan) as w:
            for t in plan:
                w.write(t.name, generate_tensor(spec, t.name, seed, WeightScheme(), live).to(dtype))
                if progress is not None:
                    progress(t.name, t.nbytes)
    if len(shards) > 1:
        index = {
            "metadata": {"total_size": sum(t.nbytes for plan in shards for t in plan)},
            "weight_map": {t.name: fname for fname, plan in zip(files, shards, strict=True) for t in plan},
        }
        write_json(out / INDEX_FILE, index)
