"""Safetensors checkpoints: header checks without reading data, then tensors read on demand.

The header check runs first and alone (``check_headers``) so that ``tilepilot inspect`` can vouch for a
multi-GB checkpoint in milliseconds, and so that loading never starts on a file that would fail half
way. Tensors are then read one at a time through ``safetensors.safe_open`` (memory-mapped), so a
consumer walking the model layer by layer never holds a second full copy of the weights.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import torch
from safetensors import safe_open

from tilepilot.errors import CheckpointError
from tilepilot.model.safetensors_io import LOADABLE_DTYPES, SafetensorsHeader, read_header
from tilepilot.model.spec import ModelSpec, load_spec
from tilepilot.model.stored_blocks import StoredBlocks
from tilepilot.model.weights import LayerWeights, layer_from_lookup

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def shard_names(n: int) -> list[str]:
    """The weight files of a checkpoint in ``n`` shards, as Hugging Face names them (one file needs no index)."""
    return [SINGLE_FILE] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]


PICKLE_PATTERNS = ("pytorch_model*.bin", "*.pt", "*.pth", "*.ckpt")
# Names a checkpoint may carry that are not weights (rotary caches some exporters save).
IGNORED_EXTRA_SUFFIXES = ("rotary_emb.inv_freq",)


@dataclass
class HeaderReport:
    """What the safetensors headers say about a checkpoint, checked against the spec."""

    files: list[str]
    n_tensors: int
    total_bytes: int
    dtypes: dict[str, int]
    extra: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "files": self.files,
            "n_tensors": self.n_tensors,
            "total_bytes": self.total_bytes,
            "dtypes": self.dtypes,
            "extra": self.extra,
            "warnings": self.warnings,
        }


def weight_files(model_dir: Path) -> dict[str, Path]:
    """Map every tensor name to the file that holds it, from the index or the single file.

    Refuses pickle-only checkpoints: loading them would execute arbitrary code.
    """
    index = model_dir / INDEX_FILE
    single = model_dir / SINGLE_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise CheckpointError(
                f"{INDEX_FILE} in {model_dir} is not a valid safetensors index (no 'weight_map'); re-download it"
            ) from None
        files = {name: model_dir / fname for name, fname in weight_map.items()}
        for fname in sorted({p.name for p in files.values()}):
            if not (model_dir / fname).is_file():
                raise CheckpointError(
                    f"shard {fname} named in {INDEX_FILE} is missing from {model_dir}; re-download it"
                )
        return files
    if single.is_file():
        header = read_header(single)
        return {name: single for name in header.tensors}
    if any(any(model_dir.glob(p)) for p in PICKLE_PATTERNS):
        raise CheckpointError(
            f"{model_dir} holds only pickle checkpoints (.bin/.pt); tilepilot loads safetensors only — "
            "convert the weights to model.safetensors first"
        )
    raise CheckpointError(f"{model_dir} has no {SINGLE_FILE} or {INDEX_FILE}; pass a Hugging Face model directory")


def check_headers(model_dir: str | Path, spec: ModelSpec) -> HeaderReport:
    """Check tensor names, shapes and dtypes from the headers alone; raise on the first hard problem."""
    model_dir = Path(model_dir)
    files = weight_files(model_dir)
    headers: dict[Path, SafetensorsHeader] = {p: read_header(p) for p in sorted(set(files.values()))}
    found: dict[str, tuple[Path, object]] = {}
    for path, header in headers.items():
        for name, info in header.tensors.items():
            found[name] = (path, info)
    for name, path in files.items():
        if name not in headers[path].tensors:
            raise CheckpointError(f"{INDEX_FILE} places {name} in {path.name}, but that shard does not hold it")
    expected = spec.tensor_shapes()
    missing = [n for n in expected if n not in found]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(f"tensor {missing[0]}{more} is missing from the checkpoint in {model_dir}")
    dtypes: dict[str, int] = {}
    for name, shape in expected.items():
        path, info = found[name]
        if tuple(info.shape) != tuple(shape):
            raise CheckpointError(
                f"tensor {name} in {path.name} has shape {list(info.shape)} but config.json implies {list(shape)}"
            )
        if info.dtype not in LOADABLE_DTYPES:
            raise CheckpointError(f"tensor {name} is stored as {info.dtype}; tilepilot loads BF16, F16 or F32 weights")
        dtypes[info.dtype] = dtypes.get(info.dtype, 0) + 1
    extra = sorted(
        n for n in found if n not in expected and not n.endswith(IGNORED_EXTRA_SUFFIXES) and n != "lm_head.weight"
    )
    warnings = (
        [f"{len(extra)} tensor(s) not used by this architecture will be ignored, e.g. {extra[0]}"] if extra else []
    )
    if spec.tied_embeddings and "lm_head.weight" in found:
        warnings.append("config ties embeddings but the checkpoint also stores lm_head.weight; the embedding is used")
    total = sum(h.data_bytes for h in headers.values())
    return HeaderReport(
        files=sorted(p.name for p in headers),
        n_tensors=sum(len(h.tensors) for h in headers.values()),
        total_bytes=total,
        dtypes=dtypes,
        extra=extra,
        warnings=warnings,
    )


class Checkpoint:
    """A local Hugging Face checkpoint, read one tensor at a time in its stored dtype."""

    def __init__(self, model_dir: str | Path, spec: ModelSpec | None = None):
        self.model_dir = Path(model_dir)
        self.spec = spec or load_spec(self.model_dir)
        self.report = check_headers(self.model_dir, self.spec)
        self._files = weight_files(self.model_dir)
        self._handles: dict[Path, object] = {}

    @property
    def warnings(self) -> list[str]:
        return self.report.warnings

    def names(self) -> list[str]:
        return sorted(self._files)

    def _handle(self, path: Path):
        h = self._handles.get(path)
        if h is None:
            try:
                h = safe_open(str(path), framework="pt", device="cpu")
            except Exception as e:  # safetensors raises its own error types
                raise CheckpointError(f"cannot open {path.name}: {e}; re-download or rewrite it") from None
            self._handles[path] = h
        return h

    def get(self, name: str) -> torch.Tensor:
        """One tensor in its stored dtype (BF16/F16/F32), freshly read."""
        path = self._files.get(name)
        if path is None:
            raise CheckpointError(f"tensor {name} is missing from the checkpoint in {self.model_dir}")
        try:
            return self._handle(path).get_tensor(name)
        except CheckpointError:
            raise
        except Exception as e:
            raise CheckpointError(f"cannot read {name} from {path.name}: {e}; the file may be corrupt") from None

    def layer(self, i: int) -> LayerWeights:
        return layer_from_lookup(self.spec, i, self.get)

    def embed(self) -> torch.Tensor:
        return self.get("model.embed_tokens.weight")

    def final_norm(self) -> torch.Tensor:
        return self.get("model.norm.weight")

    def lm_head(self) -> torch.Tensor:
        if self.spec.tied_embeddings:
            return self.embed()
        return self.get("lm_head.weight")

    @cached_property
    def stored_blocks(self) -> StoredBlocks:
        """The quantized blocks the directory's GGUF stored (empty unless imported from a quantized GGUF)."""
        return StoredBlocks(self.model_dir)

    def close(self) -> None:
        self._handles.clear()


def load_checkpoint(model_dir: str | Path, spec: ModelSpec | None = None) -> Checkpoint:
    """Open and header-check a checkpoint directory; tensors are read later, on demand."""
    return Checkpoint(model_dir, spec)
