"""The FastAPI application: OpenAI-compatible ``/v1`` routes over one ``Engine``.

Request bodies are read and validated here rather than by FastAPI's body binding, so that every bad
request (wrong content type, malformed JSON, a field out of range, a prompt longer than the context)
gets an OpenAI-style error body ``{"error": {"message", "type", "param", "code"}}`` with a 4xx status
and a message naming the problem. Everything that can be rejected is rejected before a stream starts,
so a stream only fails for server-side reasons (then an error event precedes ``data: [DONE]``).

Each request becomes one engine job; its events cross from the engine's worker thread to the event
loop through ``call_soon_threadsafe`` into an asyncio queue. A client that goes away (stream cancelled
by Starlette on ``http.disconnect``, or a non-streaming client polled as disconnected) cancels its job,
which frees the runner at the next token.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from tilepilot.errors import InputError, TokenizerError
from tilepilot.runtime.sampling import SamplingParams
from tilepilot.serve.engine import (
    DEFAULT_MAX_TOKENS,
    ContextLengthError,
    Engine,
    Event,
    Failed,
    Finished,
    GenerationParams,
    Job,
    ServerBusy,
    ShuttingDown,
    TextDelta,
)
from tilepilot.serve.schemas import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    ChatResponseMessage,
    Completion,
    CompletionChoice,
    CompletionChunk,
    CompletionChunkChoice,
    CompletionRequest,
    ErrorBody,
    ErrorDetail,
    ModelCard,
    ModelList,
    PromptTokensDetails,
    TilepilotFigures,
    Usage,
)

MAX_BODY_BYTES = 8 * 1024 * 1024  # a 128k-token prompt is well under 1 MiB of text
DISCONNECT_POLL_S = 0.25  # how often a non-streaming request checks that its client is still there


class ApiError(Exception):
    """An error the client caused (or can act on), rendered as an OpenAI error body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.detail = ErrorDetail(message=message, type=type, param=param, code=code)

    def response(self) -> JSONResponse:
        return JSONResponse(ErrorBody(error=self.detail).model_dump(), status_code=self.status)


def _as_api_error(e: BaseException) -> ApiError:
    """Map engine and tokenizer errors to statuses; anything unexpected is a 500 that names the error."""
    if isinstance(e, ApiError):
        return e
    if isinstance(e, ContextLengthError):
        return ApiError(400, str(e), param="messages", code="context_length_exceeded")
    if isinstance(e, ServerBusy):
        return ApiError(429, str(e), type="server_busy", code="queue_full")
    if isinstance(e, ShuttingDown):
        return ApiError(503, str(e), type="server_error", code="shutting_down")
    if isinstance(e, (InputError, TokenizerError)):
        return ApiError(400, str(e))
    return ApiError(500, f"internal error: {type(e).__name__}: {e}", type="server_error")


def _validation_message(e: ValidationError, model: type[BaseModel]) -> tuple[str, str | None]:
    """One sentence per problem: the parameter, what is wrong, the value sent, and why when we know."""
    parts = []
    first_param = None
    for err in e.errors(include_url=False):
        loc = ".".join(str(x) for x in err.get("loc", ()))
        param = str(err["loc"][0]) if err.get("loc") else None
        first_param = first_param or param
        msg = f"{loc or 'body'}: {err.get('msg')}"
        if err.get("type") != "missing" and "input" in err and not isinstance(err["input"], (dict, list)):
            msg += f" (got {err['input']!r})"
        info = model.model_fields.get(param or "")
        if info is not None and info.description:
            msg += f"; {info.description}"
        parts.append(msg)
    return "; ".join(parts[:5]), first_param


async def _read_json(request: Request) -> Any:
    ctype = request.headers.get("content-type", "")
    if ctype.split(";")[0].strip().lower() != "application/json":
        raise ApiError(
            415,
            f"the request body must be JSON with Content-Type: application/json (got {ctype or 'none'!r})",
            code="unsupported_media_type",
        )
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise ApiError(413, f"the request body exceeds {MAX_BODY_BYTES // (1024 * 1024)} MiB", code="too_large")
    try:
        return json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the request body is not valid JSON ({e})", code="invalid_json") from None


def _parse(data: Any, model: type[BaseModel]) -> Any:
    if not isinstance(data, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {type(data).__name__}", code="invalid_json")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        message, param = _validation_message(e, model)
        raise ApiError(400, message, param=param, code="invalid_value") from None


def _figures(f: Finished) -> TilepilotFigures:
    return TilepilotFigures(
        modeled_ttft_s=f.modeled_ttft_s,
        modeled_decode_tok_s=f.modeled_decode_tok_s,
        ttft_cpu_measured_s=f.ttft_cpu_measured_s,
        decode_cpu_measured_s_per_token=f.decode_cpu_measured_s_per_token,
        measured_host_s=f.measured_host_s,
        measured_queue_s=f.measured_queue_s,
        cached_prompt_tokens=f.cached_tokens,
    )


def _usage(f: Finished) -> Usage:
    return Usage(
        prompt_tokens=f.prompt_tokens,
        completion_tokens=f.completion_tokens,
        total_tokens=f.prompt_tokens + f.completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=f.cached_tokens),
    )


def _sse(obj: BaseModel) -> str:
    """One server-sent event. Chunks leave out what OpenAI leaves out: unset delta fields, null usage/extension."""
    d = obj.model_dump()
    for choice in d.get("choices", ()):
        if isinstance(choice.get("delta"), dict):
            choice["delta"] = {k: v for k, v in choice["delta"].items() if v is not None}
    for key in ("usage", "tilepilot"):
        if key in d and d[key] is None:
            del d[key]
    return f"data: {json.dumps(d, ensure_ascii=False)}\n\n"


class _Stream:
    """Bridges one engine job to the event loop: the worker thread's events land in an asyncio queue."""

    def __init__(self, engine: Engine, ids: list[int], params: GenerationParams):
        loop = asyncio.get_running_loop()
        self.events: asyncio.Queue[Event] = asyncio.Queue()

        def sink(ev: Event) -> None:
            loop.call_soon_threadsafe(self.events.put_nowait, ev)

        self.job: Job = engine.submit(ids, params, sink)


def create_app(engine: Engine) -> FastAPI:
    """The application for one engine (started here, stopped with the app's lifespan)."""
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start()
        yield
        engine.stop()

    app = FastAPI(
        title="tilepilot",
        description="OpenAI-compatible API over a tilepilot deployment. NPU figures are modeled (XDNA2 timing "
        "model); host times are measured.",
        lifespan=lifespan,
    )
    app.state.engine = engine

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, e: ApiError) -> JSONResponse:
        return e.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code)
        return ApiError(e.status_code, f"{request.method} {request.url.path}: {e.detail}", code=code).response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, e: Exception) -> JSONResponse:
        return _as_api_error(e).response()

    def check_model(name: str | None) -> None:
        if name is not None and name != engine.model_id:
            raise ApiError(
                404,
                f"the model {name!r} does not exist here; this server serves {engine.model_id!r} (see /v1/models)",
                param="model",
                code="model_not_found",
            )

    def params_of(req: ChatCompletionRequest | CompletionRequest, ids: list[int], default: int) -> GenerationParams:
        try:
            max_tokens = engine.resolve_max_tokens(ids, req.token_budget, default=default)
        except ContextLengthError as e:
            param = "messages" if isinstance(req, ChatCompletionRequest) else "prompt"
            raise ApiError(400, str(e), param=param, code="context_length_exceeded") from None
        sampling = SamplingParams(temperature=req.temperature, top_p=req.top_p, seed=req.seed)
        return GenerationParams(max_tokens=max_tokens, sampling=sampling, stop=req.stop_list())

    def submit(ids: list[int], params: GenerationParams) -> _Stream:
        try:
            return _Stream(engine, ids, params)
        except (ServerBusy, ShuttingDown) as e:
            raise _as_api_error(e) from None

    async def collect(request: Request, stream: _Stream) -> Finished:
        """Wait for the end of a non-streaming job; cancel it if the client goes away meanwhile."""
        checked = time.monotonic()
        try:
            while True:
                try:
                    ev = await asyncio.wait_for(stream.events.get(), DISCONNECT_POLL_S)
                except asyncio.TimeoutError:
                    ev = None
                if time.monotonic() - checked >= DISCONNECT_POLL_S:  # text events may never leave a gap
                    checked = time.monotonic()
                    if await request.is_disconnected():
                        stream.job.cancel()
                        raise ApiError(499, "the client closed the request", code="client_closed")
                if isinstance(ev, Failed):
                    raise _as_api_error(ev.error)
                if isinstance(ev, Finished):
                    if ev.finish_reason == "cancelled":
                        raise _as_api_error(ShuttingDown("the generation was stopped: the server is shutting down"))
                    return ev
        finally:
            stream.job.cancel()  # no-op when finished; frees the runner when this handler is cancelled

    async def events_of(stream: _Stream) -> AsyncIterator[TextDelta | Finished]:
        """The job's events until it finishes; a failure becomes an SSE error event."""
        try:
            while True:
                ev = await stream.events.get()
                if isinstance(ev, Failed):
                    raise _as_api_error(ev.error)
                if isinstance(ev, Finished) and ev.finish_reason == "cancelled":
                    raise _as_api_error(ShuttingDown("the generation was stopped: the server is shutting down"))
                yield ev
                if isinstance(ev, Finished):
                    return
        finally:
            stream.job.cancel()  # client gone (Starlette cancels the stream) or done: free the runner

    def sse_response(chunks: AsyncIterator[str]) -> StreamingResponse:
        async def body() -> AsyncIterator[str]:
            try:
                async for c in chunks:
                    yield c
            except ApiError as e:
                yield _sse(ErrorBody(error=e.detail))
            yield "data: [DONE]\n\n"

        return StreamingResponse(
            body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        )

    def finish_of(f: Finished) -> str:
        return "stop" if f.finish_reason == "stop" else "length"

    # ---- routes ---------------------------------------------------------------------------------
    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": engine.model_id, "busy": engine.busy, "queued": engine.pending}

    @app.get("/v1/models")
    async def models() -> ModelList:
        return ModelList(data=[ModelCard(id=engine.model_id, created=engine.created, context_length=engine.context)])

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> ModelCard:
        check_model(model_id)
        return ModelCard(id=engine.model_id, created=engine.created, context_length=engine.context)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(request: Request) -> JSONResponse | StreamingResponse:
        req: ChatCompletionRequest = _parse(await _read_json(request), ChatCompletionRequest)
        check_model(req.model)
        messages = [{"role": m.role, "content": m.text()} for m in req.messages]
        try:
            ids = await run_in_threadpool(engine.chat_ids, messages)
        except (TokenizerError, InputError) as e:
            raise ApiError(400, str(e), param="messages") from None
        params = params_of(req, ids, default=DEFAULT_MAX_TOKENS)
        stream = submit(ids, params)
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

        def chunk(delta: ChatDelta, finish: str | None = None, **extra: Any) -> str:
            choices = [ChatChunkChoice(delta=delta, finish_reason=finish)]
            return _sse(ChatCompletionChunk(id=rid, created=created, model=engine.model_id, choices=choices, **extra))

        if not req.stream:
            f = await collect(request, stream)
            return JSONResponse(
                ChatCompletion(
                    id=rid,
                    created=created,
                    model=engine.model_id,
                    choices=[ChatChoice(message=ChatResponseMessage(content=f.text), finish_reason=finish_of(f))],
                    usage=_usage(f),
                    tilepilot=_figures(f),
                ).model_dump()
            )

        async def chunks() -> AsyncIterator[str]:
            yield chunk(ChatDelta(role="assistant", content=""))
            async for ev in events_of(stream):
                if isinstance(ev, TextDelta):
                    yield chunk(ChatDelta(content=ev.text))
                else:
                    yield chunk(ChatDelta(), finish_of(ev), tilepilot=_figures(ev))
                    if req.include_usage:
                        yield _sse(
                            ChatCompletionChunk(
                                id=rid, created=created, model=engine.model_id, choices=[], usage=_usage(ev)
                            )
                        )

        return sse_response(chunks())

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> JSONResponse | StreamingResponse:
        req: CompletionRequest = _parse(await _read_json(request), CompletionRequest)
        check_model(req.model)
        prompt = req.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise ApiError(400, f"one prompt per request, got {len(prompt)}", param="prompt")
            prompt = prompt[0]
        try:
            ids = await run_in_threadpool(engine.prompt_ids, prompt)
        except InputError as e:
            raise ApiError(400, str(e), param="prompt") from None
        params = params_of(req, ids, default=16)
        stream = submit(ids, params)
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())

        if not req.stream:
            f = await collect(request, stream)
            return JSONResponse(
                Completion(
                    id=rid,
                    created=created,
                    model=engine.model_id,
                    choices=[CompletionChoice(text=f.text, finish_reason=finish_of(f))],
                    usage=_usage(f),
                    tilepilot=_figures(f),
                ).model_dump()
            )

        def chunk(text: str, finish: str | None = None, **extra: Any) -> str:
            choices = [CompletionChunkChoice(text=text, finish_reason=finish)]
            return _sse(CompletionChunk(id=rid, created=created, model=engine.model_id, choices=choices, **extra))

        async def chunks() -> AsyncIterator[str]:
            async for ev in events_of(stream):
                if isinstance(ev, TextDelta):
                    yield chunk(ev.text)
                else:
                    yield chunk("", finish_of(ev), tilepilot=_figures(ev))
                    if req.include_usage:
                        yield _sse(
                            CompletionChunk(
                                id=rid, created=created, model=engine.model_id, choices=[], usage=_usage(ev)
                            )
                        )

        return sse_response(chunks())

    return app
