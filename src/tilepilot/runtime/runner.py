"""NpuRunner: prefill and decode of a deployment plan on the modeled NPU, with a KV cache and sampling.

The runner owns the model's weights (bf16, one copy, registered as device buffers), the KV cache and
the host-side steps (embedding lookup, RoPE tables, sampling). Everything between the embedding and
the logits goes through the plan's groups via the ``Dispatcher``: NPU groups run their kernels'
designs (``design.fast``, never the oracle), CPU groups run cpu ops. Every dispatch, sync and CPU
step lands in the ``Trace`` (kind ``cpu`` for CPU work): NPU, sync and CPU-group times are modeled, CPU steps
outside the plan measured.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tilepilot.errors import InputError
from tilepilot.model.checkpoint import load_checkpoint
from tilepilot.model.graph import BLOCK_OUTPUT, LAYER_INPUT, block_graph
from tilepilot.model.quant import deployment_weights
from tilepilot.model.spec import ModelSpec
from tilepilot.model.tokenizer import Tokenizer
from tilepilot.model.weights import WeightSource
from tilepilot.npu.calibration import CALIBRATION, Calibration
from tilepilot.npu.device import Device, npu2
from tilepilot.npu.trace import Trace, on_modeled_timeline
from tilepilot.plan.plan import QUANT_FAMILIES, DeploymentPlan, check_plan
from tilepilot.runtime.buffers import BufferPool, DeviceBuffer
from tilepilot.runtime.dispatcher import CpuOpTimer, Dispatcher, KernelLibrary, KVState, Pass, sync_costs
from tilepilot.runtime.kv_cache import KVCache
from tilepilot.runtime.rope_tables import RopeTables
from tilepilot.runtime.sampling import Sampler, SamplingParams
from tilepilot.runtime.threads import step_threads
from tilepilot.runtime.workspace import Workspace, load_workspace

BF16 = torch.bfloat16


@dataclass
class RunnerStep:
    """Logits (fp32) of one prefill or decode call, and the block outputs when captured."""

    logits: torch.Tensor
    layer_outputs: list[torch.Tensor] | None = None
    start: int = 0


@dataclass
class GenerationResult:
    prompt_ids: list[int]
    tokens: list[int]
    finish_reason: str  # "eos" | "length"
    prefill_host_s: float  # measured wall clock of the functional prefill
    decode_host_s: float  # measured wall clock of all decode steps
    modeled_ttft_s: float  # modeled: NPU dispatches + buffer syncs + CPU groups' modeled host cost of the prefill
    modeled_decode_s: list[float] = field(default_factory=list)  # same, per decode step
    dispatches_prefill: int = 0
    dispatches_decode: int = 0

    @property
    def n_decode_steps(self) -> int:
        return len(self.modeled_decode_s)

    @property
    def modeled_decode_s_per_token(self) -> float:
        return sum(self.modeled_decode_s) / len(self.modeled_decode_s) if self.modeled_decode_s else 0.0

    @property
    def host_decode_tok_s(self) -> float:
        return self.n_decode_steps / self.decode_host_s if self.decode_host_s > 0 else 0.0


def _bf16(t: torch.Tensor) -> torch.Tensor:
    t = t if t.dtype == BF16 else t.to(BF16)
    return t.contiguous()


class NpuRunner:
    """Runs a ``DeploymentPlan`` over a ``WeightSource``.

    ``trust_static`` and ``static_buffers`` are the stale-buffer fault hooks: naming a buffer that
    changes (e.g. ``"decode.x"``) as static makes every call after its first upload read stale data.
    """

    def __init__(
        self,
        plan: DeploymentPlan,
        weights: WeightSource,
        device: Device | None = None,
        trace: Trace | None = None,
        *,
        cal: Calibration = CALIBRATION,
        trust_static: bool = True,
        static_buffers: Sequence[str] = (),
        max_context: int | None = None,
        library: KernelLibrary | None = None,
        timer: CpuOpTimer | None = None,
        dry: bool = False,
    ):
        self.spec: ModelSpec = weights.spec
        check_plan(plan, self.spec)
        self.plan = plan
        self.device = device or npu2()
        self.trace = trace if trace is not None else Trace()
        self.graph = block_graph(self.spec)
        self.library = library or KernelLibrary(self.device, cal)
        self.pool = BufferPool(plan.host, sync_costs(cal), trust_static=trust_static)
        self.dry = dry
        self.dispatcher = Dispatcher(
            self.spec, self.graph, plan.host, self.pool, self.trace, self.library, timer or CpuOpTimer(cal=cal)
        )
        self.static_buffers = tuple(static_buffers)
        self.max_context = min(self.spec.max_positions, max_context or self.spec.max_positions)
        self._load(weights)
        self.load_s = self.pool.stats.modeled_s  # modeled one-time uploads of preloaded weights
        self.cache = KVCache(
            self.spec.n_layers,
            self.spec.kv_dim,
            self.max_context,
            device="meta" if dry else "cpu",
            fmt=plan.weight_format().kv_cache,
        )
        self.rope = RopeTables(self.spec)
        self.workspace: Workspace | None = None  # set by ``open``
        self._tokenizer: Tokenizer | None = None

    # ---- opening a deployment -----------------------------------------------------------------
    @classmethod
    def open(
        cls,
        workspace: str | Path | Workspace,
        *,
        plan: DeploymentPlan | None = None,
        weights: WeightSource | None = None,
        trace: Trace | None = None,
        **options: Any,
    ) -> NpuRunner:
        """The one way to open a deployment: its plan, its checkpoint, its recorded runtime options.

        Every command, the phases, the evaluator, the server and the report go through here, so a runtime
        option recorded by the deployment (e.g. buffers treated as static) can never be forgotten by one of
        them. ``plan`` times or runs another plan over the same checkpoint (a proposal, a built-in plan);
        ``weights`` reuses a checkpoint already open; ``options`` override the recorded ones.
        """
        ws = workspace if isinstance(workspace, Workspace) else load_workspace(workspace)
        runner = cls(
            plan if plan is not None else ws.plan,
            weights if weights is not None else load_checkpoint(ws.model_dir),
            trace=trace,
            **{**ws.runner_options, **options},
        )
        runner.workspace = ws
        return runner

    @property
    def tokenizer(self) -> Tokenizer:
        """The deployment's tokenizer (read on first use: gates and timing never need it)."""
        if self._tokenizer is None:
            if self.workspace is None:
                raise InputError("this runner was built without a workspace; open it with NpuRunner.open(WORKSPACE)")
            self._tokenizer = Tokenizer.from_dir(self.workspace.model_dir)
        return self._tokenizer

    # ---- weights -------------------------------------------------------------------------------
    def _load(self, weights: WeightSource) -> None:
        """Register each tensor once in bf16 as a device buffer (preloaded policies pay the upload here)."""
        s = self.spec
        weights = deployment_weights(weights, self.plan.weight_format())
        self.weights = weights  # the deployed model (dequantized values where the plan packs weights)
        self.embed = _bf16(weights.embed())
        self._layers: list[dict[str, DeviceBuffer]] = []
        self._decode_layers: list[dict[str, DeviceBuffer]] = []
        needed = {w for n in self.graph.block for w in n.weights}
        packed = {  # per stage, the weights whose kernel streams the packed blocks (qgemv, qgemm)
            stage: {self.graph.node(c.op).weights[0] for g in self.plan.stage(stage).block for c in g.calls
                    if c.family in QUANT_FAMILIES}
            for stage in ("prefill", "decode")
        }  # fmt: skip
        for i in range(s.n_layers):
            lw = weights.layer(i)
            bf = {name: self.pool.weight(f"layer{i}.{name}", _bf16(getattr(lw, name))) for name in sorted(needed)}
            stages = []
            for stage in ("prefill", "decode"):
                mine = dict(bf)
                for name in sorted(packed[stage]):
                    key = f"layer{i}.{name}.packed"
                    mine[name] = self.pool.get(key) or self.pool.weight(key, weights.packed(i, name).data)
                stages.append(mine)
            self._layers.append(stages[0])
            self._decode_layers.append(stages[1])
        packs_head = self.plan.weight_format().packs_head
        head = self.embed if s.tied_embeddings and not packs_head else _bf16(weights.lm_head())
        norm = self.pool.weight("final_norm", _bf16(weights.final_norm()))
        self._heads = {}
        for stage in ("prefill", "decode"):  # a quantized head kernel (qgemv) streams the packed head
            packed = any(c.family in QUANT_FAMILIES for g in self.plan.stage(stage).head for c in g.calls)
            name = "lm_head.packed" if packed else "lm_head"
            buf = self.pool.get(name) or self.pool.weight(name, weights.packed_head().data if packed else head)
            self._heads[stage] = {"final_norm": norm, "lm_head": buf}

    # ---- state ---------------------------------------------------------------------------------
    @property
    def position(self) -> int:
        return self.cache.length

    def reset(self) -> None:
        self.cache.reset()

    # ---- forward passes ------------------------------------------------------------------------
    def prefill(self, ids: Sequence[int], capture_layers: bool = False, all_logits: bool = True) -> RunnerStep:
        """Start a new sequence with the prompt; logits for every position (or only the last)."""
        self.reset()
        return self.extend(ids, capture_layers, all_logits)

    def extend(self, ids: Sequence[int], capture_layers: bool = False, all_logits: bool = True) -> RunnerStep:
        """Append tokens after the cached ones through the prefill plan (chunked prefill)."""
        ids = self._check_ids(ids)
        if self.cache.length + len(ids) > self.max_context:
            raise InputError(
                f"prompt has {self.cache.length + len(ids)} tokens but the model's context is {self.max_context}; "
                "shorten it"
            )
        return self._forward(ids, "prefill", capture_layers, last_only=not all_logits)

    def decode(self, token_id: int, capture_layers: bool = False) -> RunnerStep:
        """One decode step for ``token_id`` at the next position."""
        ids = self._check_ids([token_id])
        if self.cache.length == 0:
            raise InputError("decode() needs a prefilled sequence; call prefill() with the prompt first")
        if self.cache.length + 1 > self.max_context:
            raise InputError(
                f"the conversation has reached the model's context of {self.max_context} tokens; "
                "start a new one or shorten the prompt"
            )
        return self._forward(ids, "decode", capture_layers, last_only=False)

    def _check_ids(self, ids: Sequence[int]) -> list[int]:
        ids = [int(i) for i in ids]
        if not ids:
            raise InputError("the prompt is empty; give at least one token")
        bad = [i for i in ids if not 0 <= i < self.spec.vocab]
        if bad:
            raise InputError(f"token ids {bad[:5]} are outside the vocabulary of {self.spec.vocab}; re-tokenize")
        return ids

    def _forward(self, ids: list[int], stage: str, capture: bool, last_only: bool) -> RunnerStep:
        with step_threads(len(ids), self.spec.hidden):
            return self._forward_pass(ids, stage, capture, last_only)

    def _forward_pass(self, ids: list[int], stage: str, capture: bool, last_only: bool) -> RunnerStep:
        s = self.spec
        start, rows = self.cache.length, len(ids)
        p = Pass(stage=stage, start=start, rows=rows, dry=self.dry)
        stage_plan = self.plan.stage(stage)
        self.cache.reserve(rows)

        t0 = time.perf_counter()
        self.dispatcher.set_stage(stage)
        x_buf = self.pool.buffer(f"{stage}.{LAYER_INPUT}")
        if self.dry:
            x_buf.write(torch.empty(rows, s.hidden, dtype=BF16, device="meta"))
        else:
            x_buf.write(self.embed[torch.tensor(ids)])
        tables = self.pool.buffer(f"{stage}.rope_tables", kind="table")
        tables.write(self.rope.table(start, rows))
        for name in self.static_buffers:
            if self.pool.get(name) is not None:
                self.pool.mark_static(name)
        self.trace.add("cpu", "embed+rope_tables", time.perf_counter() - t0, stage=stage)  # measured: outside the plan

        kv = KVState(cache=self.cache)
        fused = stage_plan.one_dispatch
        self.dispatcher.begin_pass(
            fused, stage_plan.kv_readback if fused else None, stage_plan.resident, stage_plan.prefetch
        )
        outputs: list[torch.Tensor] | None = [] if capture else None
        x = x_buf
        try:
            for layer in range(s.n_layers):
                env = {LAYER_INPUT: x}
                layer_weights = self._decode_layers[layer] if stage == "decode" else self._layers[layer]
                self.dispatcher.run(stage_plan.block, env, layer_weights, p, layer, kv, tables)
                x = env[BLOCK_OUTPUT]
                if outputs is not None:
                    outputs.append(_peek(x))
            if last_only and rows > 1:
                x = self._last_row(x, stage)
            head_pass = Pass(stage=stage, start=start, rows=1 if last_only else rows, dry=self.dry)
            env = {LAYER_INPUT: x}
            self.dispatcher.run(stage_plan.head, env, self._heads[stage], head_pass, None, kv, tables)
        except BaseException:
            self.dispatcher.abort_pass()  # a runner reused after an error (the server) starts clean
            raise
        self.dispatcher.end_pass(one_dispatch_name(stage), stage)
        logits_buf = env[self.graph.head[-1].output]
        self.dispatcher.set_stage(stage)
        logits = self.pool.host_view(logits_buf).float()
        self.cache.advance(rows)
        return RunnerStep(logits=logits, layer_outputs=outputs, start=start)

    def _last_row(self, buf: DeviceBuffer, stage: str) -> DeviceBuffer:
        """The head reads only the last position: a view through an offset access pattern, no copy."""
        last = self.pool.buffer(f"{stage}.x_last")
        if buf.device_fresh:
            self.pool.produced(last, buf.device[-1:])
        else:
            last.write(buf.host[-1:])
        return last

    # ---- generation ----------------------------------------------------------------------------
    def generate(
        self,
        ids: Sequence[int],
        max_new_tokens: int,
        sampling: SamplingParams | None = None,
        stream_callback: Callable[[int], None] | None = None,
        stop_ids: Sequence[int] | None = None,
    ) -> GenerationResult:
        """Prefill ``ids`` then sample up to ``max_new_tokens`` tokens, stopping at an EOS id."""
        if max_new_tokens < 0:
            raise InputError(f"max new tokens must be >= 0, got {max_new_tokens}")
        ids = self._check_ids(ids)
        if len(ids) > self.max_context:
            raise InputError(f"prompt has {len(ids)} tokens but the model's context is {self.max_context}; shorten it")
        sampler = Sampler(sampling or SamplingParams())
        stops = set(self.spec.eos_ids if stop_ids is None else stop_ids)
        mark = len(self.trace.events)
        t0 = time.perf_counter()
        step = self.prefill(ids, all_logits=False)
        prefill_s = time.perf_counter() - t0
        modeled_ttft = window_s(self.trace, mark)
        dispatches_prefill = _window_count(self.trace, mark)
        tokens: list[int] = []
        modeled_decode: list[float] = []
        dispatches_decode = 0
        reason = "length"
        t_dec = 0.0
        budget = min(max_new_tokens, self.max_context - len(ids) + 1)
        logits = step.logits[-1]
        with step_threads(1, self.spec.hidden):  # every step from here is one token (sampling included)
            while len(tokens) < budget:
                tok = sampler.sample(logits)
                tokens.append(tok)
                if stream_callback is not None:
                    stream_callback(tok)
                if tok in stops:
                    reason = "eos"
                    break
                if len(tokens) == budget:
                    break
                mark = len(self.trace.events)
                t1 = time.perf_counter()
                logits = self.decode(tok).logits[-1]
                t_dec += time.perf_counter() - t1
                modeled_decode.append(window_s(self.trace, mark))
                dispatches_decode += _window_count(self.trace, mark)
        return GenerationResult(
            prompt_ids=ids,
            tokens=tokens,
            finish_reason=reason,
            prefill_host_s=prefill_s,
            decode_host_s=t_dec,
            modeled_ttft_s=modeled_ttft,
            modeled_decode_s=modeled_decode,
            dispatches_prefill=dispatches_prefill,
            dispatches_decode=dispatches_decode,
        )


def one_dispatch_name(stage: str) -> str:
    """The trace group of a stage that runs as one dispatch per pass (``StagePlan.one_dispatch``)."""
    return f"{stage}_one_dispatch"


def _peek(buf: DeviceBuffer) -> torch.Tensor:
    """Read a value for a capture without a modeled sync (debug instrumentation, not part of the run)."""
    return (buf.device if buf.device_fresh else buf.host).float().clone()


def window_s(trace: Trace, mark: int) -> float:
    """Timeline time of the top-level events since ``mark``: modeled NPU/syncs plus the plan's modeled CPU groups."""
    return sum(e.duration_s for e in trace.events[mark:] if on_modeled_timeline(e))


def _window_count(trace: Trace, mark: int) -> int:
    return sum(1 for e in trace.events[mark:] if e.kind == "dispatch")
