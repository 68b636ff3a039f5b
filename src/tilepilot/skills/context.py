"""What a skill's ``run(ctx)`` reads and writes, split along what it holds.

``DeployContext`` is one deployment run. It owns four parts, each built on first use, and a phase asks the one
it needs:

- ``ctx.workspace`` (``skills/workspace.py``): ``deployment.json`` (plan, model directory, recorded facts) and
  the journal beside it;
- ``ctx.model`` (``skills/reference.py``): the checkpoint, its FP32 oracle and tokenizer, and the oracle's
  cached side of every gate;
- ``ctx.runners`` (``skills/runners.py``): production runners of any plan over the checkpoint, the kernel
  library and host timer of the run, and the cached modeled timings;
- ``ctx.knowledge`` (``skills/knowledge.py``): the kernel registry and lessons shared between deployments.

Beside them it holds the run's state the orchestrator and phases 4-5 set (``failure``, ``opt_stage``,
``full_proposal_gate``). The flat names of the parts' members (``ctx.plan``, ``ctx.oracle``,
``ctx.make_runner``, ...) still resolve, through ``FLAT_NAMES``, for the optimization and debug skills and the
model-gate harness, which take the whole context.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tilepilot.errors import WorkspaceError
from tilepilot.model.quant import WeightFormat
from tilepilot.model.spec import load_spec
from tilepilot.plan.plan import with_weights
from tilepilot.runtime import workspace as ws_mod
from tilepilot.runtime.workspace import RUNTIME_KEY
from tilepilot.skills.base import SkillResult
from tilepilot.skills.classify import Diagnosis
from tilepilot.skills.knowledge import KNOWLEDGE_LESSONS, KNOWLEDGE_LESSONS_MD, KNOWLEDGE_REGISTRY, Knowledge
from tilepilot.skills.reference import ModelReference
from tilepilot.skills.runners import RunnerFactory, perf_figures
from tilepilot.skills.settings import TIMING_PROMPT_LEN, TUNE_MAX_CANDIDATES, Settings
from tilepilot.skills.weights import WEIGHTS_KEY, check_format, describe, weights_record
from tilepilot.skills.workspace import DeployWorkspace, checkpoint_files, file_digest, plan_digest

__all__ = [
    "KNOWLEDGE_LESSONS",
    "KNOWLEDGE_LESSONS_MD",
    "KNOWLEDGE_REGISTRY",
    "RUNTIME_KEY",
    "TIMING_PROMPT_LEN",
    "TUNE_MAX_CANDIDATES",
    "DeployContext",
    "Failure",
    "Settings",
    "checkpoint_files",
    "file_digest",
    "perf_figures",
    "plan_digest",
]

# Flat name -> the part that holds it (``DeployContext.__getattr__``).
FLAT_NAMES = {
    **dict.fromkeys(
        (
            "journal",
            "plan",
            "save_plan",
            "get_extra",
            "set_extra",
            "model_dir",
            "runtime_options",
            "write_text",
            "checkpoint_digest",
        ),
        "workspace",
    ),
    **dict.fromkeys(("weights", "spec", "oracle", "tokenizer", "reference"), "model"),
    **dict.fromkeys(
        ("library", "host_timer", "make_runner", "timing", "performance_summary", "tuning_stats"), "runners"
    ),
    **dict.fromkeys(("kernel_registry", "load_lessons", "known_repair"), "knowledge"),
}


@dataclass
class Failure:
    """The failed phase result a debug skill is asked to repair, with its classification."""

    phase: str
    result: SkillResult
    diagnosis: Diagnosis


@dataclass
class DeployContext:
    """One deployment run: its workspace, model reference, runner factory and shared knowledge."""

    root: Path
    settings: Settings = field(default_factory=Settings)
    failure: Failure | None = None  # set by the orchestrator while a debug skill runs
    opt_stage: str | None = None  # "prefill" / "decode" while phase 4 / 5 runs its optimization skills
    full_proposal_gate: bool = False  # gate proposals with all greedy_steps (a phase's retry after a late failure)

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        self.workspace = DeployWorkspace(self.root)
        self.runners = RunnerFactory(
            self.workspace, lambda fmt: self.model.weights_for(fmt), self.settings.timing_prompt_len
        )
        self.knowledge = Knowledge(self.settings.knowledge_dir, self.workspace.journal)
        self._model: ModelReference | None = None

    @property
    def model(self) -> ModelReference:
        """The model reference, built on first use (it reads the model directory from deployment.json)."""
        if self._model is None:
            fmt = self.workspace.plan.weight_format()
            self._model = ModelReference(self.workspace.model_dir, fmt, self.settings.greedy_steps, self.runners.draft)
        return self._model

    def __getattr__(self, name: str) -> Any:
        part = FLAT_NAMES.get(name)
        if part is None:
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")
        return getattr(getattr(self, part), name)

    def __setattr__(self, name: str, value: Any) -> None:
        """A flat name set on the context (e.g. a test's own kernel library) is set on the part that holds it."""
        part = FLAT_NAMES.get(name)
        if part is None or part not in self.__dict__ and part != "model":
            object.__setattr__(self, name, value)
        else:
            setattr(getattr(self, part), name, value)

    @property
    def _reference_cache(self) -> dict:
        """The oracle's cached answers (harness/model_gate keeps its teacher-forced logits beside the gate's)."""
        return self.model.cache

    def record_lesson(self, signature: str, skill: str, remedy: str, phase: str) -> None:
        """Remember a repaired failure of this model in the workspace (finalize-and-learn publishes it)."""
        self.knowledge.record_lesson(signature, skill, remedy, phase, self.model.spec)

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def create(
        cls, model_dir: str | Path, out: str | Path, *, resume: bool = False, settings: Settings | None = None
    ) -> DeployContext:
        """Scope-check ``model_dir`` and scaffold (or, with ``resume``, reopen) the workspace ``out``."""
        out = Path(out)
        settings = settings or Settings()
        spec = load_spec(model_dir)  # scope check: raises ScopeError/ConfigError with one sentence
        fmt = settings.weights
        if fmt is not None:
            check_format(fmt, spec)
        deployment = out / ws_mod.DEPLOYMENT_FILE
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
            recorded = ws.plan.weight_format()
            if fmt is not None and fmt != recorded:
                kv = f", KV cache {fmt.kv_cache}" if fmt.kv_cache != recorded.kv_cache else ""
                raise WorkspaceError(
                    f"{out} deploys {describe(ws.extra.get(WEIGHTS_KEY))} weights, not {fmt.format} (block "
                    f"{fmt.block}{kv}); resume it without --weights and --kv-cache or choose a new --out directory"
                )
        else:
            if out.exists() and any(out.iterdir()) and not resume:
                raise WorkspaceError(f"{out} exists and is not empty; choose a new --out directory")
            ws = ws_mod.make_workspace(model_dir, "default", out, overwrite=False)
            fmt = fmt or WeightFormat()
            if fmt.quantized or fmt.kv_cache != "bf16":
                ws.plan = with_weights(ws.plan, fmt)
            ws.extra[WEIGHTS_KEY] = weights_record(fmt, ws.model_dir, spec)
            ws.save()
        ctx = cls(out, settings)
        if ctx.workspace.journal.scaffold(spec.name or spec.architecture):
            ctx.knowledge.inherit_lessons(spec)
            ctx.workspace.journal.progress(f"weights: {describe(ctx.workspace.get_extra(WEIGHTS_KEY))}")
        return ctx
