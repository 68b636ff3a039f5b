"""Pydantic models of the OpenAI API subset the server speaks: requests, responses, stream chunks, errors.

Requests accept (and ignore) fields we do not know, as OpenAI-compatible servers do, so newer clients that
send extra options still work; fields we know but cannot honour (``n > 1``, ``logprobs``, penalties,
tools) are rejected with a message naming them rather than silently ignored. Ranges follow the OpenAI
reference (temperature in [0, 2], top_p in (0, 1], at most 4 stop sequences).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# ---- requests -------------------------------------------------------------------------------------


class TextPart(BaseModel):
    """One part of a multi-part message content; only text parts exist on a text-only model."""

    model_config = ConfigDict(extra="allow")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        """The content as one string (multi-part text contents are concatenated)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = False


class _SamplingRequest(BaseModel):
    """Fields common to both endpoints: sampling, length, stop, streaming."""

    model_config = ConfigDict(extra="allow")
    # optional, as vLLM's and llama.cpp's servers have it: one model is served, and a client that names none means it
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=1, description="one sequence per request")
    presence_penalty: float = Field(0.0, ge=0.0, le=0.0, description="penalties are not implemented")
    frequency_penalty: float = Field(0.0, ge=0.0, le=0.0, description="penalties are not implemented")
    user: str | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        items = [v] if isinstance(v, str) else (v or [])
        if len(items) > 4:
            raise ValueError(f"at most 4 stop sequences, got {len(items)}")
        if any(s == "" for s in items):
            raise ValueError("stop sequences must be non-empty strings")
        return v

    def stop_list(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: Literal[False] | None = Field(None, description="logprobs are not implemented")
    tools: list[Any] | None = Field(None, max_length=0, description="tool calling is not implemented")

    @property
    def token_budget(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_SamplingRequest):
    prompt: str | list[str] | list[int] = Field(description="one prompt: text, a list of one text, or token ids")
    max_tokens: int | None = Field(16, ge=1)  # the OpenAI default for completions
    echo: Literal[False] = Field(False, description="echo is not implemented")
    logprobs: None = Field(None, description="logprobs are not implemented")
    best_of: int = Field(1, ge=1, le=1, description="one sequence per request")
    suffix: None = Field(None, description="suffix (insertion) is not implemented")

    @property
    def token_budget(self) -> int | None:
        return self.max_tokens


# ---- responses ------------------------------------------------------------------------------------


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0  # prompt tokens whose KV rows were reused from the previous request


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = PromptTokensDetails()


class TilepilotFigures(BaseModel):
    """The extension field of every response: modeled NPU figures beside measured host time.

    There is no NPU on this machine: ``modeled_*`` come from the deployment's XDNA2 timing model for the
    dispatches and buffer syncs this request ran, on the runner's timeline, which also holds the plan's CPU
    groups (e.g. decode attention on the host) at their modeled host cost. The wall clock those CPU groups took
    on this machine is reported beside (``*_cpu_measured_*``), not inside. ``measured_*`` are wall clock of
    this process.
    """

    modeled_ttft_s: float = Field(description="modeled time to first token of this request's prefill")
    modeled_decode_tok_s: float | None = Field(description="modeled decode tokens/s (None: no decode step)")
    ttft_cpu_measured_s: float = Field(
        description="measured wall clock of the plan's CPU groups in this prefill (beside modeled_ttft_s, not in it)"
    )
    decode_cpu_measured_s_per_token: float = Field(description="the same per decode step")
    measured_host_s: float = Field(description="measured host wall clock of the functional run")
    measured_queue_s: float = Field(description="measured wait in the server's queue before the run")
    cached_prompt_tokens: int
    note: str = (
        "modeled_* = XDNA2 timing model of the NPU dispatches and syncs (no NPU here) plus the plan's CPU groups' "
        "modeled host cost; *_cpu_measured_* = those CPU groups' wall clock here; measured_* = host wall clock"
    )


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: ChatResponseMessage
    finish_reason: Literal["stop", "length"]
    logprobs: None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    tilepilot: TilepilotFigures


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: Literal["stop", "length"]
    logprobs: None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    tilepilot: TilepilotFigures


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    finish_reason: Literal["stop", "length"] | None = None
    logprobs: None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    tilepilot: TilepilotFigures | None = None


class CompletionChunkChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: Literal["stop", "length"] | None = None
    logprobs: None = None


class CompletionChunk(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChunkChoice]
    usage: Usage | None = None
    tilepilot: TilepilotFigures | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "tilepilot"
    context_length: int  # not in OpenAI's schema; what clients of local servers look for


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# ---- errors ---------------------------------------------------------------------------------------


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(BaseModel):
    error: ErrorDetail
