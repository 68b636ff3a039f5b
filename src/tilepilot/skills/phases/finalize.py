"""Phase 6, finalize-and-learn: the final plan generates end to end, and what was learned is kept.

Generation runs prefill and decode in one runner through ``NpuRunner.generate`` (the path ``tilepilot
generate`` uses) and must reproduce the oracle's greedy tokens under the vLLM token-set rule. Learning
means two files in the shared knowledge directory: the kernel registry (every instance of the final plan
with its phase-1-style gate metrics and modeled time, plus the rows tile tuning searched), which makes a
later deployment of the same shapes a lookup, and the lessons (novel failures with their repairs, and
which optimizations were kept or rejected), which a later deployment reads at its start.
"""

from __future__ import annotations

import json
import time
from typing import Any

from tilepilot.files import write_text_atomic
from tilepilot.gates import metrics as M
from tilepilot.gates.gate import Gate, Threshold
from tilepilot.harness.model_gate import gate_prompts
from tilepilot.harness.probes import probe_plan
from tilepilot.harness.quant_quality import quantization_quality
from tilepilot.harness.quant_quality import render as render_quality
from tilepilot.kernels.bind import family_module, make_config
from tilepilot.kernels.registry import RegistryRow
from tilepilot.kernels.tuning import modeled_seconds, timing_key
from tilepilot.npu.trace import library_layouts
from tilepilot.skills.base import PhaseSkill, SkillInput
from tilepilot.skills.journal import TRACE_DIR, atomic_write_json
from tilepilot.skills.knowledge import KNOWLEDGE_LESSONS, KNOWLEDGE_LESSONS_MD, KNOWLEDGE_REGISTRY
from tilepilot.skills.phases.common import WORKSPACE_INPUT, finish
from tilepilot.skills.phases.kernels import probe_evidence
from tilepilot.skills.runners import perf_figures

SRC_GEN = "DESIGN.md section 6 phase 6: generate works (greedy tokens equal the oracle's under the token-set rule)"
QUALITY_KEY = "quantization_error"  # evidence key of the reported measure (the deploy summary reads it)
QUALITY_FILE = "quantization_error.md"
SRC_LEARN = "DESIGN.md section 6 phase 6: registry and LESSONS updated"
GENERATE_TOKENS = 16  # enough decode steps to exercise the KV cache; the model gate already checked 32


def _registry_rows(ctx, probes) -> list[Any]:

    rows, name = [], ctx.model.spec.name or ctx.model.spec.architecture
    for p in probes:
        if not p.ok:
            continue
        mod = family_module(p.call.family)
        shape = mod.Shape(**p.shape)
        design = mod.make_design(shape, make_config(mod, shape, p.config))
        gate = {k: p.measurements[k] for k in ("pearson", "max_abs_err", "max_rel_err") if k in p.measurements}
        rows.append(
            RegistryRow(
                family=p.call.family,
                shape=p.shape,
                config=p.config,
                modeled_s=modeled_seconds(design),
                gate=gate,
                source=f"deploy:{name}",
                timing_key=timing_key(),
                notes=p.call.label(),
            )
        )
    return rows


def _perf_lessons(ctx) -> list[dict[str, Any]]:
    """Which optimizations were kept or rejected, per stage, as compact lesson rows."""
    out = []
    for phase in ("prefill-optimization", "decode-optimization"):
        g = ctx.workspace.journal.read_gate(phase) or {}
        for s in (g.get("evidence") or {}).get("skills", []):
            for row in s.get("applied", []) + s.get("rejected", []):
                out.append(
                    {
                        "kind": "optimization",
                        "model": ctx.model.spec.name or ctx.model.spec.architecture,
                        "family": ctx.model.spec.family,
                        "skill": s["skill"],
                        "stage": row.get("target"),
                        "change": row.get("change"),
                        "decision": row.get("decision"),
                    }
                )
    return out


def _oracle_greedy(ctx, ids: list[int], n: int) -> tuple[list[int], list[list[int]]]:
    """The oracle's greedy tokens and top-5 ids on the gate prompt: the model gate's cached reference when it is
    long enough (the deployment computed it once, in phase 0), else a fresh run."""

    ref = ctx.model.reference(*gate_prompts(ctx))
    if ref.prompt == list(ids) and len(ref.greedy_tokens) >= n:
        return ref.greedy_tokens[:n], ref.greedy_top5[:n]
    g = ctx.model.oracle.greedy(ids, n)
    return g.tokens, g.top5_per_step


class FinalizeAndLearn(PhaseSkill):
    name = "finalize-and-learn"
    phase = 6
    description = (
        "Runs prefill and decode of the final plan in one runner through generate, checks the tokens against the "
        "oracle, re-validates every kernel instance of the final plan, then writes them as rows of the shared "
        "kernel registry and publishes the deployment's lessons (repairs, kept and rejected optimizations) for "
        "later deployments. Use after decode-optimization passes."
    )
    purpose = "Closes the deployment and makes the next one of the same shapes faster to tune and debug."
    inputs = (
        WORKSPACE_INPUT,
        SkillInput("knowledge", "directory of the shared registry.json and lessons.json", required=False),
    )
    commands = (
        "tilepilot skills run finalize-and-learn WORKSPACE --knowledge ~/.cache/tilepilot/knowledge --json",
        "tilepilot generate WORKSPACE --prompt 'Once upon a time' --max-new-tokens 32",
    )
    gate_text = (
        "generate produces the oracle's greedy tokens (identical, or each side's token in the other's top-5 at the "
        "first divergence); every kernel instance of the final plan passes its kernel gate; at least one lesson is "
        "written; registry rows are written when a knowledge directory is configured."
    )
    failure_modes = (
        "A kernel instance introduced by optimization fails its probe: the gate fails and names it.",
        "An unwritable knowledge directory: the registry is not updated and the gate fails.",
    )

    def run(self, ctx):
        import torch

        plan = ctx.workspace.plan
        ids, _ = gate_prompts(ctx)
        runner = ctx.runners.make_runner(plan)
        t0 = time.perf_counter()
        gen = runner.generate(ids, GENERATE_TOKENS, stop_ids=())
        host_s = time.perf_counter() - t0
        # the final plan's run as Chrome traces (trace/prefill.json, trace/decode.json) for Perfetto and the report

        traces = runner.trace.write_stages(ctx.root / TRACE_DIR, library_layouts(runner.library))
        ref_tokens, ref_top5 = _oracle_greedy(ctx, ids, GENERATE_TOKENS)
        # generate does not return the runner's top-5 per step; the token-set rule reads it only at the first
        # divergence, so a second runner replays the steps up to there (none when the tokens are identical).
        test_top5: list[list[int]] = []
        diverge = M.first_divergence(ref_tokens, gen.tokens)
        if diverge is not None:
            check_runner = ctx.runners.make_runner(plan)
            logits = check_runner.prefill(ids).logits[-1]
            for tok in gen.tokens[: diverge + 1]:
                test_top5.append(torch.topk(logits, 5).indices.tolist())
                logits = check_runner.decode(tok).logits[-1]
        check = M.greedy_token_set_check(ref_tokens, gen.tokens, ref_top5, test_top5)
        text = None
        if ctx.model.tokenizer is not None:
            text = ctx.model.tokenizer.decode(gen.tokens)

        probes = probe_plan(plan, ctx.model.spec, ctx.settings.gate_prompt_len, seed=ctx.settings.seed, tile=False)
        failed = [p for p in probes if not p.ok]

        # learn: registry rows + lessons
        written: dict[str, Any] = {"registry_rows": 0, "lessons": 0}
        lessons_ws = json.loads((ctx.root / "lessons.json").read_text()) if (ctx.root / "lessons.json").exists() else {}
        new_lessons = list(lessons_ws.get("lessons", [])) + _perf_lessons(ctx)
        summary_lesson = (
            f"Final plan: {plan.dispatches_text()}; modeled TTFT@{ctx.settings.timing_prompt_len} "
            f"{perf_figures(plan, ctx.runners.timing(plan))['ttft_s']:.4f} s."
        )
        ctx.workspace.journal.lesson(f"finalize: {ctx.model.spec.name or ctx.model.spec.architecture}", summary_lesson)
        written["lessons"] = len(new_lessons) + 1
        kd = ctx.settings.knowledge_dir
        if kd is not None:
            registry = ctx.knowledge.kernel_registry
            for row in _registry_rows(ctx, probes):
                registry.add(row)
            registry.save(kd / KNOWLEDGE_REGISTRY)
            written["registry_rows"] = len(registry)
            lp = kd / KNOWLEDGE_LESSONS
            old = ctx.knowledge.load_lessons()
            seen = {json.dumps(x, sort_keys=True) for x in old}
            merged = old + [x for x in new_lessons if json.dumps(x, sort_keys=True) not in seen]
            atomic_write_json(lp, {"lessons": merged})
            md = kd / KNOWLEDGE_LESSONS_MD
            prev = md.read_text(encoding="utf-8") if md.exists() else "# Lessons shared between deployments\n\n"
            write_text_atomic(
                md, prev + f"## {ctx.model.spec.name or ctx.model.spec.architecture}\n\n{summary_lesson}\n\n"
            )
        m = {
            "generate.tokens": float(len(gen.tokens)),
            "generate.token_set_ok": float(check.passed),
            "final_plan.instances_failed": float(len(failed)),
            "lessons_written": float(written["lessons"]),
        }
        thresholds = [
            Threshold("generate.token_set_ok", ">=", 1, SRC_GEN),
            Threshold("final_plan.instances_failed", "<=", 0, SRC_LEARN + " (rows only for valid instances)"),
            Threshold("lessons_written", ">=", 1, SRC_LEARN),
        ]
        if kd is not None:
            m["registry_rows"] = float(written["registry_rows"])
            thresholds.append(Threshold("registry_rows", ">=", 1, SRC_LEARN))
        report = Gate("phase6-finalize-and-learn", thresholds).evaluate(m)
        evidence = {
            **probe_evidence(probes),
            "generated_tokens": gen.tokens,
            "generated_text": text,
            "greedy_check": check.message,
            "host_generate_s": host_s,
            "modeled_ttft_s": gen.modeled_ttft_s,
            "modeled_decode_s_per_token": gen.modeled_decode_s_per_token,
            "knowledge_dir": str(kd) if kd else None,
            "written": written,
            "traces": {phase: str(p) for phase, p in traces.items()},
        }
        files = []
        if ctx.model.source_oracle is not ctx.model.oracle:  # quantized weights or cache: reported beside the gate,
            # never part of it (issue 14 item 4)
            q = quantization_quality(
                ctx.runners.make_runner(plan), ctx.model.source_oracle, ctx.model.tokenizer, seed=ctx.settings.seed
            )
            evidence[QUALITY_KEY] = q
            lines = render_quality(q)
            files.append(
                str(ctx.workspace.write_text(QUALITY_FILE, "# Quantization error\n\n" + "\n".join(lines) + "\n"))
            )
            ctx.workspace.journal.progress(" ".join(x.strip() for x in lines))
        summary = (
            f"generated {len(gen.tokens)} tokens ({check.message}); {len(probes) - len(failed)}/{len(probes)} final "
            f"instances valid; {written['registry_rows']} registry rows, {written['lessons']} lessons"
        )
        return finish(self, ctx, report, evidence, summary, extra_files=files)
