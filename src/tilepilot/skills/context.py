"""What a skill's ``run(ctx)`` reads and writes: the workspace, its plan, the model, and shared caches.

One object per deployment run. It loads the checkpoint, the oracle and the oracle's reference outputs
lazily and once, because every optimization attempt re-runs the full-model gate and the oracle side of
that comparison never changes with the plan. The plan itself always round-trips through
``deployment.json`` (``save_plan``), so what a skill keeps is exactly what a resumed or evaluated
deployment will see.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from tilepilot.errors import TokenizerError, WorkspaceError
from tilepilot.files import write_text_atomic
from tilepilot.harness.model_gate import oracle_reference
from tilepilot.kernels.registry import Registry
from tilepilot.model.checkpoint import load_checkpoint
from tilepilot.model.spec import load_spec
from tilepilot.model.tokenizer import Tokenizer
from tilepilot.oracle.model import Oracle
from tilepilot.plan.builtin import default_plan, iron_like_plan, paper_like_plan
from tilepilot.runtime import workspace as ws_mod
from tilepilot.runtime.dispatcher import HostOpTimer, KernelLibrary
from tilepilot.runtime.runner import NpuRunner
from tilepilot.runtime.timing import time_plan
from tilepilot.skills.base import SkillResult
from tilepilot.skills.classify import Diagnosis
from tilepilot.skills.journal import Journal, atomic_write_json

# Figures every deployment is timed at: the paper's and IRON's published TTFT are at 2048 tokens
# (reference/xdna2.md, "Published LLM results"), and decode is timed at the same context.
TIMING_PROMPT_LEN = 2048

# Configs the tuner validates and times per new shape, taken from the family's own ranking (best guesses
# first). Validating one design of a 2048-token GEMM costs ~0.1-0.2 s of host time, so an exhaustive search
# of every GEMM shape (hundreds of candidates each) would dominate a deployment; 24 keeps the first
# deployment of a shape to seconds, and the registry makes later ones lookups.
TUNE_MAX_CANDIDATES = 24

# deployment.json key of the runner options a deployment records beside its plan.
RUNTIME_KEY = "runtime"

KNOWLEDGE_REGISTRY = "registry.json"
KNOWLEDGE_LESSONS = "lessons.json"
KNOWLEDGE_LESSONS_MD = "LESSONS.md"


@dataclass(frozen=True)
class Settings:
    """Knobs of a deployment run (sizes of the validation workloads, where shared knowledge lives).

    ``gate_prompt_len`` tokens are prefilled for the model gate and ``greedy_steps`` tokens generated:
    32 is the paper-era upstream gate (xdna2.md "Numerical gates": greedy 32 tokens). Each optimization proposal
    is gated with ``proposal_greedy_steps`` greedy tokens instead (plus every other check of the gate), because a
    full-size model pays one pass over all its weights per token and phases 4-5 gate a dozen proposals; the
    phase's own gate then runs all ``greedy_steps`` on the plan it keeps, and so does the evaluator. ``knowledge_dir``
    holds the kernel registry and lessons shared between deployments (None: no sharing).
    """

    gate_prompt_len: int = 24
    greedy_steps: int = 32
    proposal_greedy_steps: int = 8
    timing_prompt_len: int = TIMING_PROMPT_LEN
    kernel_tokens: int = 8
    seed: int = 0
    knowledge_dir: Path | None = None
    tune_max_candidates: int = TUNE_MAX_CANDIDATES
    # Block-FP16 trials are opt-in: the executor simulates bfp16 by re-quantizing the (static) weights on every
    # call, ~16 s for a 49k x 2k LM head on 2 cores, which makes every later gate and `generate` on the host
    # impractically slow even when the modeled NPU time is lower. The NPU result is unaffected by this choice.
    try_bfp16: bool = False


@dataclass
class Failure:
    """The failed phase result a debug skill is asked to repair, with its classification."""

    phase: str
    result: SkillResult
    diagnosis: Diagnosis


def file_digest(paths: list[Path]) -> str:
    """SHA-256 over the named files' bytes (in the given order), streamed."""
    h = hashlib.sha256()
    for p in paths:
        h.update(p.name.encode())
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def checkpoint_files(model_dir: Path) -> list[Path]:
    """The weight files of a checkpoint directory, in a stable order."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise WorkspaceError(f"no *.safetensors files in {model_dir}; point the workspace at a checkpoint directory")
    return files


def plan_digest(plan: Any) -> str:
    """A short fingerprint of a plan's content (what a gate was measured on)."""
    return hashlib.sha256(json.dumps(plan.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class DeployContext:
    """The workspace of one deployment and lazily built, shared heavy objects."""

    root: Path
    settings: Settings = field(default_factory=Settings)
    failure: Failure | None = None  # set by the orchestrator while a debug skill runs
    opt_stage: str | None = None  # "prefill" / "decode" while phase 4 / 5 runs its optimization skills
    full_proposal_gate: bool = False  # gate proposals with all greedy_steps (a phase's retry after a late failure)

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        self.journal = Journal(self.root)
        self._timing_cache: dict[tuple[str, int], Any] = {}
        self._reference_cache: dict[tuple[int, ...], Any] = {}
        self.tuning_stats: dict[str, dict[str, int]] = {}  # per stage: registry lookups vs configs searched

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def create(cls, model_dir: str | Path, out: str | Path, *, resume: bool = False, settings: Settings | None = None):
        """Scope-check ``model_dir`` and scaffold (or, with ``resume``, reopen) the workspace ``out``."""

        out = Path(out)
        spec = load_spec(model_dir)  # scope check: raises ScopeError/ConfigError with one sentence
        deployment = out / "deployment.json"
        if deployment.exists() and not resume:
            raise WorkspaceError(
                f"{out} already holds a deployment; pass --resume to continue it or choose a new --out directory"
            )
        if resume and deployment.exists():
            ws = ws_mod.load_workspace(out)
            if Path(ws.model_dir).resolve() != Path(model_dir).resolve():
                raise WorkspaceError(
                    f"{out} is a deployment of {ws.model_dir}, not {model_dir}; resume it with that model directory"
                )
        else:
            if out.exists() and any(out.iterdir()) and not resume:
                raise WorkspaceError(f"{out} exists and is not empty; choose a new --out directory")
            ws_mod.make_workspace(model_dir, "default", out, overwrite=False)
        ctx = cls(out, settings or Settings())
        if ctx.journal.scaffold(spec.name or spec.architecture):
            ctx._inherit_lessons(spec)
        return ctx

    def _inherit_lessons(self, spec) -> None:
        """Start a new workspace's LESSONS.md with what earlier deployments learned (same family first)."""
        lessons = self.load_lessons()
        if not lessons:
            return
        mine = [x for x in lessons if x.get("family") == spec.family] or lessons
        repairs = [x for x in mine if x.get("signature")]
        opts = [x for x in mine if x.get("kind") == "optimization"]
        lines = [
            f"- `{x['signature']}` in {x.get('model')}: repaired by `{x['skill']}` ({x['remedy']})" for x in repairs
        ]
        lines += [
            f"- {x.get('model', 'an earlier model')}: `{x.get('skill')}` ({x.get('stage')}) {x.get('change')}: "
            f"{x.get('decision')}"
            for x in opts[-30:]
        ]
        if lines:
            self.journal.lesson("From earlier deployments (knowledge directory)", "\n".join(lines))

    def known_repair(self, signature: str) -> str | None:
        """How an earlier deployment repaired this signature, if one did (for the debug log)."""
        for x in reversed(self.load_lessons()):
            if x.get("signature") == signature:
                return f"seen before in {x.get('model')}: `{x.get('skill')}` {x.get('remedy')}"
        return None

    # ---- workspace ----------------------------------------------------------------------------
    def _workspace(self):

        return ws_mod.load_workspace(self.root)

    @cached_property
    def model_dir(self) -> Path:
        return Path(self._workspace().model_dir)

    @property
    def plan(self):
        return self._workspace().plan

    def save_plan(self, plan) -> None:
        """Validate ``plan`` against the block graph and make it the workspace's plan (atomic write)."""
        self._workspace().set_plan(plan)

    def get_extra(self, key: str, default: Any = None) -> Any:
        return self._workspace().extra.get(key, default)

    def set_extra(self, key: str, value: Any) -> None:
        """Store a journal-level fact (e.g. the checkpoint digest) beside the plan in deployment.json."""
        ws = self._workspace()
        ws.extra[key] = value
        ws.save()

    # ---- model --------------------------------------------------------------------------------
    @cached_property
    def weights(self):

        return load_checkpoint(self.model_dir)

    @property
    def spec(self):
        return self.weights.spec

    @cached_property
    def oracle(self):

        return Oracle(self.weights)

    @cached_property
    def tokenizer(self):
        """The checkpoint's tokenizer, or None when it has none (gates then use token ids only)."""

        try:
            return Tokenizer.from_dir(self.model_dir)
        except TokenizerError:
            return None

    def reference(self, prompt: list[int], second: list[int]):
        """The oracle's side of the model gate for these prompts (computed once per run; plans do not change it)."""

        key = (tuple(prompt), tuple(second), self.settings.greedy_steps)
        if key not in self._reference_cache:
            self._reference_cache[key] = oracle_reference(
                self.oracle, prompt, second, self.settings.greedy_steps, draft=self._runner_draft
            )
        return self._reference_cache[key]

    def _runner_draft(self, prefix: list[int], n: int) -> list[int]:
        """The production runner's greedy on the current plan: a cheap guess the oracle verifies (one bf16 pass
        over the weights per token instead of an FP32 one; a wrong guess only costs time)."""
        return self.make_runner(self.plan).generate(prefix, n, stop_ids=()).tokens

    def checkpoint_digest(self) -> str:
        return file_digest(checkpoint_files(self.model_dir))

    # ---- shared knowledge ---------------------------------------------------------------------
    def knowledge_path(self, name: str) -> Path | None:
        kd = self.settings.knowledge_dir
        return None if kd is None else Path(kd) / name

    @cached_property
    def kernel_registry(self):
        """The shared kernel registry (knowledge dir) loaded once; tuning adds rows, finalize-and-learn saves."""

        p = self.knowledge_path(KNOWLEDGE_REGISTRY)
        if p is None:
            return Registry()
        try:
            return Registry.load(p)
        except Exception as e:  # a damaged shared registry must not stop a deployment: start empty, say so
            self.journal.progress(f"shared registry {p} unreadable ({e}); starting with an empty one")
            return Registry()

    def load_lessons(self) -> list[dict[str, Any]]:
        p = self.knowledge_path(KNOWLEDGE_LESSONS)
        if p is None or not p.exists():
            return []
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            return []
        return list(data.get("lessons", [])) if isinstance(data, dict) else []

    def record_lesson(self, signature: str, skill: str, remedy: str, phase: str) -> None:
        """Remember a repaired failure in this workspace; finalize-and-learn publishes it to the knowledge dir."""
        p = self.root / "lessons.json"
        data = json.loads(p.read_text(encoding="utf-8")) if p.exists() else {"lessons": []}
        data["lessons"].append(
            {
                "signature": signature,
                "skill": skill,
                "remedy": remedy,
                "phase": phase,
                "model": self.spec.name or self.spec.architecture,
                "family": self.spec.family,
            }
        )
        atomic_write_json(p, data)

    def write_text(self, name: str, text: str) -> Path:
        p = self.root / name
        write_text_atomic(p, text)
        return p

    # ---- runtime ------------------------------------------------------------------------------
    @cached_property
    def library(self):
        """Designs built once per (family, shape, config) for every runner and timing of this run."""

        return KernelLibrary()

    @cached_property
    def host_timer(self):
        """One CPU-step timer per run. CPU groups get a modeled host cost (HostCost.cpu_model_s), so every figure
        phases 4-5 keep or revert on is a function of the plan, the code and the constants only."""

        return HostOpTimer()

    def runtime_options(self) -> dict[str, Any]:
        """Runner options the workspace records beside the plan (e.g. buffers the runtime treats as static)."""
        return dict(self.get_extra(RUNTIME_KEY, {}) or {})

    def make_runner(self, plan=None, trace=None, **options):
        """The production runner for ``plan`` (default: the deployed one) with the workspace's runtime options."""

        return NpuRunner.open(
            self._workspace(),
            plan=plan or self.plan,
            weights=self.weights,
            trace=trace,
            library=self.library,
            **options,
        )

    # ---- timing -------------------------------------------------------------------------------
    def timing(self, plan, prompt_len: int | None = None):
        """Modeled timing of ``plan`` (cached by plan content: skills time the same plan many times)."""

        n = prompt_len or self.settings.timing_prompt_len
        key = (plan_digest(plan), n)
        if key not in self._timing_cache:
            self._timing_cache[key] = time_plan(
                plan, plan.model_spec(), prompt_len=n, library=self.library, timer=self.host_timer
            )
        return self._timing_cache[key]

    def performance_summary(self) -> dict[str, Any]:
        """Modeled TTFT / decode before (default plan) and after (deployed), with paper-like for scale."""

        spec = self.plan.model_spec()
        out: dict[str, Any] = {"prompt_len": self.settings.timing_prompt_len, "clock": "modeled"}
        for label, plan in (
            ("before", default_plan(spec)),
            ("after", self.plan),
            ("paper_like", paper_like_plan(spec)),
            ("iron_like", iron_like_plan(spec)),  # same-model speed-ups are against both (issue 11 item 8)
        ):
            out[label] = perf_figures(plan, self.timing(plan))
        return out


def perf_figures(plan, timing) -> dict[str, Any]:
    """The figures the summary, the claims and the perf trajectory quote for one plan.

    Totals are modeled throughout: NPU dispatches, syncs and the CPU groups' modeled host cost
    (``*_cpu_modeled_*``). The ``*_cpu_measured_*`` keys name the part of a total that is measured: none
    any more (0.0); they stay for readers of claims recorded when CPU groups were timed by wall clock.
    """
    decode_s = float(timing.decode_s_per_token)
    cpu = {st: sum(g.cpu_s for g in timing.stage_groups(st)) for st in ("prefill", "decode")}
    return {
        "plan": plan.name,
        "ttft_s": float(timing.ttft_s),
        "decode_ms_per_token": decode_s * 1e3,
        "decode_tok_s": 1.0 / decode_s if decode_s > 0 else float("inf"),
        "ttft_cpu_modeled_s": cpu["prefill"],
        "decode_cpu_modeled_ms": cpu["decode"] * 1e3,
        "ttft_cpu_measured_s": 0.0,
        "decode_cpu_measured_ms": 0.0,
        "dispatches_per_layer": {s: plan.dispatches_per_layer(s) for s in ("prefill", "decode")},
    }
