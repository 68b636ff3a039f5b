"""The engine: one ``NpuRunner`` behind a FIFO queue, one worker thread, prefix KV-cache reuse.

A deployment is one runner with one KV cache, so requests are served one at a time, in the order they
arrived; concurrency is a queue, not parallel sequences. The worker thread owns the runner (nothing
else touches it), so the HTTP event loop never blocks on a forward pass.

Multi-turn chat re-sends the whole conversation each turn. The cache still holds the K/V rows of the
previous request (its prompt and the tokens generated after it), so the engine keeps the ids those
rows belong to and, for a new prompt, keeps the rows of the longest common prefix and runs only the
rest through the prefill plan (``runner.extend``). The reported ``modeled_ttft_s`` is then the modeled
time of that shorter prefill, and ``cached_tokens`` says how many prompt tokens were reused.

Cancellation (a client that disconnects, Ctrl-C in the chat, server shutdown) is checked before every
token, so a cancelled generation frees the runner at the next token.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tilepilot.errors import InputError, TilepilotError, TokenizerError
from tilepilot.model.gguf.source import model_name
from tilepilot.model.tokenizer import IncrementalDecoder
from tilepilot.runtime.runner import NpuRunner, window_s
from tilepilot.runtime.sampling import Sampler, SamplingParams
from tilepilot.runtime.threads import step_threads
from tilepilot.serve.stops import StopMatcher

DEFAULT_MAX_TOKENS = 256  # when a chat request names no limit (the context of a served model can be 128k)


class ContextLengthError(InputError):
    """The prompt (plus the requested completion) does not fit the model's context."""


class ServerBusy(TilepilotError):
    """The queue of waiting requests is full."""


class ShuttingDown(TilepilotError):
    """The engine stopped before or while serving the request."""


@dataclass(frozen=True)
class GenerationParams:
    max_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class TextDelta:
    """Text that can no longer change (complete UTF-8 characters, not part of a possible stop string)."""

    text: str


@dataclass(frozen=True)
class Finished:
    text: str
    finish_reason: str  # "stop" (EOS or stop string) | "length" | "cancelled"
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    modeled_ttft_s: float  # timeline of this request's prefill (only the uncached part), as the runner times it
    modeled_decode_s: tuple[float, ...]  # the same for each decode step
    ttft_cpu_measured_s: float  # wall clock of the plan's CPU groups on this host, beside modeled_ttft_s (not in it)
    decode_cpu_measured_s: float  # the same, summed over the decode steps
    measured_host_s: float  # measured host wall clock of the run (prefill + decode + sampling + detokenizing)
    measured_queue_s: float  # measured wait in the queue before the run started

    @property
    def modeled_decode_tok_s(self) -> float | None:
        if not self.modeled_decode_s:
            return None
        per_token = sum(self.modeled_decode_s) / len(self.modeled_decode_s)
        return 1.0 / per_token if per_token > 0 else None

    @property
    def decode_cpu_measured_s_per_token(self) -> float:
        return self.decode_cpu_measured_s / len(self.modeled_decode_s) if self.modeled_decode_s else 0.0


@dataclass(frozen=True)
class Failed:
    error: BaseException


Event = TextDelta | Finished | Failed


class Job:
    """One queued request: its prompt ids, its parameters, and where its events go."""

    def __init__(self, ids: Sequence[int], params: GenerationParams, sink: Callable[[Event], None]):
        self.ids = list(ids)
        self.params = params
        self.sink = sink
        self.submitted_s = time.perf_counter()
        self._cancel = threading.Event()

    def cancel(self) -> None:
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()


def open_deployment(workspace: str | Path) -> tuple[NpuRunner, Any, str]:
    """Open the deployment in ``workspace``: its runner, its tokenizer and the model id it is served as
    (``model_name``: a GGUF's file stem, else the checkpoint directory's name).

    Through ``NpuRunner.open``, the one way every command opens a deployment.
    """
    runner = NpuRunner.open(workspace)
    return runner, runner.tokenizer, model_name(runner.workspace.model_dir)


def cpu_measured_s(trace: Any, mark: int) -> float:
    """Measured wall clock of the plan's CPU groups since ``mark``, reported beside the modeled figures.

    The runner's window (``window_s``, what ``tilepilot generate`` prints as modeled) holds the CPU groups at
    their modeled host cost; each CPU event carries the wall clock it really took as ``measured_s``.
    """
    return sum(e.measured_s or 0.0 for e in trace.events[mark:] if e.kind == "cpu" and e.clock == "modeled")


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class Engine:
    """Serves generation requests on one runner, in arrival order, from one worker thread."""

    def __init__(self, runner: NpuRunner, tokenizer: Any, model_id: str, *, max_queue: int = 64):
        self.runner = runner
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.max_queue = max_queue
        self.eos_ids = frozenset(runner.spec.eos_ids) | frozenset(getattr(tokenizer, "eos_ids", ()) or ())
        self.created = int(time.time())
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._stopping = threading.Event()
        self._current: Job | None = None
        self._cached: list[int] = []  # the token ids whose K/V rows are in the runner's cache, in order
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # guards submit against stop

    @classmethod
    def from_workspace(cls, workspace: str | Path, **kwargs: Any) -> Engine:
        runner, tokenizer, model_id = open_deployment(workspace)
        return cls(runner, tokenizer, model_id, **kwargs)

    # ---- prompts --------------------------------------------------------------------------------
    @property
    def context(self) -> int:
        return self.runner.max_context

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def chat_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of a conversation rendered with the checkpoint's chat template (generation prompt on)."""
        if not self.has_chat_template:
            raise TokenizerError("this model has no chat template; use /v1/completions with a plain prompt")
        return list(self.tokenizer.encode_chat(messages, add_generation_prompt=True))

    def prompt_ids(self, prompt: str | Sequence[int]) -> list[int]:
        """A plain completion prompt: text (with BOS, as ``tilepilot generate``) or token ids as given."""
        if isinstance(prompt, str):
            if not prompt:
                raise InputError("the prompt is empty; give some text")
            return list(self.tokenizer.encode(prompt, add_bos=True))
        ids = [int(i) for i in prompt]
        if not ids:
            raise InputError("the prompt is empty; give at least one token id")
        vocab = self.runner.spec.vocab
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise InputError(f"token ids {bad[:5]} are outside the vocabulary of {vocab}")
        return ids

    def resolve_max_tokens(self, ids: Sequence[int], max_tokens: int | None, default: int = DEFAULT_MAX_TOKENS) -> int:
        """The completion budget, or ``ContextLengthError`` when prompt + completion exceed the context."""
        room = self.context - len(ids)
        if room < 1:
            raise ContextLengthError(
                f"the prompt has {len(ids)} tokens but the model's context is {self.context} tokens "
                "(and at least one must be left to generate); shorten the prompt"
            )
        if max_tokens is None:
            return min(default, room)
        if max_tokens > room:
            raise ContextLengthError(
                f"the model's context is {self.context} tokens, but {len(ids)} prompt tokens + max_tokens "
                f"{max_tokens} = {len(ids) + max_tokens}; lower max_tokens or shorten the prompt"
            )
        return max_tokens

    # ---- queue ----------------------------------------------------------------------------------
    def start(self) -> Engine:
        if self._thread is None:
            # daemon: a forward pass in flight must never keep the process alive after shutdown
            self._thread = threading.Thread(target=self._worker, name="tilepilot-engine", daemon=True)
            self._thread.start()
        return self

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    @property
    def busy(self) -> bool:
        return self._current is not None

    def submit(self, ids: Sequence[int], params: GenerationParams, sink: Callable[[Event], None]) -> Job:
        """Queue a request; its events (text deltas, then ``Finished`` or ``Failed``) go to ``sink``."""
        job = Job(ids, params, sink)
        with self._lock:
            if self._stopping.is_set():
                raise ShuttingDown("the server is shutting down; retry on another instance")
            if self._queue.qsize() >= self.max_queue:
                raise ServerBusy(f"{self.max_queue} requests are already waiting; retry later")
            self.start()
            self._queue.put(job)
        return job

    def generate(
        self,
        ids: Sequence[int],
        params: GenerationParams,
        on_text: Callable[[str], None] | None = None,
        job_out: list[Job] | None = None,
    ) -> Finished:
        """Blocking convenience over ``submit`` (the terminal chat): stream text to ``on_text``, return the end.

        ``job_out`` receives the job so a caller can cancel it (Ctrl-C) from the waiting thread.
        """
        events: queue.Queue[Event] = queue.Queue()
        job = self.submit(ids, params, events.put)
        if job_out is not None:
            job_out.append(job)
        while True:
            ev = events.get()
            if isinstance(ev, TextDelta):
                if on_text is not None:
                    on_text(ev.text)
            elif isinstance(ev, Failed):
                raise ev.error
            else:
                return ev

    def stop(self) -> None:
        """Stop serving: cancel the running generation (at its next token) and fail every waiting request."""
        with self._lock:
            self._stopping.set()
            current = self._current
            if current is not None:
                current.cancel()
            while True:
                try:
                    job = self._queue.get_nowait()
                except queue.Empty:
                    break
                if job is not None:
                    self._emit(job, Failed(ShuttingDown("the server shut down before serving this request")))
            self._queue.put(None)

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def close(self, timeout: float | None = None) -> None:
        """Stop, then wait for the worker to leave its forward pass. A process that exits while the daemon worker
        is still inside torch aborts in C++ ("terminate called without an active exception", exit 134)."""
        self.stop()
        self.join(timeout)

    def _worker(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            if job.cancelled:
                continue
            if self._stopping.is_set():
                self._emit(job, Failed(ShuttingDown("the server shut down before serving this request")))
                continue
            self._current = job
            end: Event
            try:
                end = self._run(job)
            except BaseException as e:  # the worker must survive anything one request does
                self._cached.clear()  # the cache may hold a half-written pass: start cold next time
                self.runner.reset()
                end = Failed(e)
            self._current = None  # before the last event: whoever it wakes sees the engine idle
            self._emit(job, end)

    def _emit(self, job: Job, event: Event) -> None:
        try:
            job.sink(event)
        except Exception:  # the receiver is gone (closed event loop, ...): stop working for it
            job.cancel()

    # ---- one generation -------------------------------------------------------------------------
    def _reuse_prefix(self, ids: list[int]) -> int:
        """Keep the cache rows of the longest common prefix with the cached ids; return how many.

        At least one prompt token is always run, because the first sampled token needs its logits.
        """
        n = min(common_prefix(self._cached, ids), len(ids) - 1)
        if n <= 0:
            n = 0
            self.runner.reset()
        else:
            self.runner.cache.seek(n)  # rows [0, n) hold exactly these tokens' K/V; the rest is overwritten
        del self._cached[n:]
        return n

    def _cancelled(self, job: Job) -> bool:
        return job.cancelled or self._stopping.is_set()

    def _run(self, job: Job) -> Finished:
        r = self.runner
        t0 = time.perf_counter()
        queued = t0 - job.submitted_s
        del r.trace.events[:]  # a long-running server keeps only the current request's timeline
        ids, p = job.ids, job.params
        if len(ids) + p.max_tokens > self.context:  # resolve_max_tokens checked this; a direct caller may not have
            raise ContextLengthError(f"{len(ids)} prompt tokens + {p.max_tokens} new exceed the context {self.context}")
        cached = self._reuse_prefix(ids)
        mark = len(r.trace.events)
        step = r.extend(ids[cached:], all_logits=False)
        self._cached[:] = ids
        modeled_ttft = window_s(r.trace, mark)
        ttft_cpu = cpu_measured_s(r.trace, mark)
        decode_cpu = 0.0

        sampler = Sampler(p.sampling)
        decoder = IncrementalDecoder(self.tokenizer)
        stops = StopMatcher(p.stop)
        pieces: list[str] = []
        modeled_decode: list[float] = []
        n_tokens = 0
        reason = "length"

        def out(text: str) -> None:
            if text:
                pieces.append(text)
                self._emit(job, TextDelta(text))

        logits = step.logits[-1]
        with step_threads(1, r.spec.hidden):  # one-token steps and their sampling on one thread
            while n_tokens < p.max_tokens:
                if self._cancelled(job):
                    reason = "cancelled"
                    break
                tok = sampler.sample(logits)
                n_tokens += 1
                if tok in self.eos_ids:
                    reason = "stop"
                    break
                text, hit = stops.push(decoder.push(tok))
                out(text)
                if hit:
                    reason = "stop"
                    break
                if n_tokens == p.max_tokens:
                    break
                mark = len(r.trace.events)
                logits = r.decode(tok).logits[-1]
                self._cached.append(tok)
                modeled_decode.append(window_s(r.trace, mark))
                decode_cpu += cpu_measured_s(r.trace, mark)
        if not stops.hit:
            text, hit = stops.push(decoder.flush())
            out(text)
            if hit:
                reason = "stop"
            out(stops.flush())
        return Finished(
            text="".join(pieces),
            finish_reason=reason,
            prompt_tokens=len(ids),
            completion_tokens=n_tokens,
            cached_tokens=cached,
            modeled_ttft_s=modeled_ttft,
            modeled_decode_s=tuple(modeled_decode),
            ttft_cpu_measured_s=ttft_cpu,
            decode_cpu_measured_s=decode_cpu,
            measured_host_s=time.perf_counter() - t0,
            measured_queue_s=queued,
        )
