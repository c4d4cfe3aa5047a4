"""The HTTP application: OpenAI's /v1/chat/completions, /v1/completions (with fill in the middle),
/v1/models, llama-server's /tokenize, /detokenize and /metrics, and /health, on FastAPI;
/openapi.json describes them.

Every request is checked and tokenized on arrival (off the event loop), then queued for the one
generation worker (engine.Engine); a full queue is a 503, a prompt longer than the context a 400.
A client that disconnects, streaming or not, waiting or being answered, cancels its request at
once. Errors are OpenAI's JSON: {"error": {"message", "type", "param", "code"}}.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import time
from contextlib import asynccontextmanager, nullcontext
from pathlib import Path
from typing import AsyncIterator, Callable

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..api import Model
from ..engine import constrain
from ..engine import tools as tool_calls
from ..engine.batcher import Batcher
from ..engine.checks import check_tokens
from ..engine.sampling import SamplingParams
from ..engine.stream import common_prefix
from ..errors import ContextFullError, InputError, ModelError, NanocompileError
from . import metrics as metrics_format
from . import openai_format as fmt
from . import schemas
from .metrics import Metrics
from .schemas import ChatRequest, CompletionRequest, Sampling
from .worker import Engine, Job, QueueFull, ShuttingDown

MAX_BODY = 8 << 20
CHAT_PAGE = (Path(__file__).parent / "chat.html").read_text(encoding="utf-8")
KEYED = ("/tokenize", "/detokenize")  # outside /v1/, also behind the API key (/health, /metrics stay open)

# the errors each endpoint can answer, for the OpenAPI document
ERRORS = {400: "a malformed or unsupported request, or a prompt longer than the context",
          401: "no or a wrong API key (Authorization: Bearer KEY)",
          413: "a body above the limit (nanocompile serve --max-body)",
          500: "the model's logits are not finite (or a bug of the server's: internal error)",
          503: "the queue is full (Retry-After: 1), or the server is shutting down"}
# one event of a stream (OpenAPI 3.1: the schema of an event stream is that of each event)
STREAM_EVENT = {"type": "object", "required": ["data"], "properties": {"data": {
    "type": "string", "description": "a chunk as JSON, or [DONE] after the last one"}}}


def error_response(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
                   code: str | None = None, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}},
                        status_code=status, headers=headers)


class FrontDoor:
    """Before a body is read: 401 for /v1/ requests without `Authorization: Bearer KEY` (when a
    key is set; /health and /openapi.json stay open, for load balancers and clients), and 413 for
    a body above the limit, declared (Content-Length) or counted as it arrives (chunked)."""

    def __init__(self, app: ASGIApp, api_key: str | None, max_body: int):
        self.app, self.key, self.max_body = app, api_key.encode() if api_key else None, max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        response = None
        if self.key is not None and (scope["path"].startswith("/v1/") or scope["path"] in KEYED):
            scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), self.key):
                response = error_response(401, "invalid or missing API key: send the header Authorization: Bearer KEY",
                                          "authentication_error", code="invalid_api_key",
                                          headers={"WWW-Authenticate": "Bearer"})
        length = headers.get(b"content-length", b"")
        if response is None and length.isdigit() and int(length) > self.max_body:
            response = error_response(413, self.too_large(f"has {int(length)} bytes"))
        if response is not None:
            return await response(scope, receive, send)
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_body:  # FastAPI turns this into the handler's JSON 413
                raise HTTPException(413, self.too_large(f"has more than {self.max_body} bytes"))
            return message

        await self.app(scope, counted, send)

    def too_large(self, what: str) -> str:
        return f"the request body {what}: the limit is {self.max_body} bytes (nanocompile serve --max-body sets it)"


class EventStream(StreamingResponse):
    """Server-sent events that stop as soon as the client disconnects (whatever ASGI version the
    server speaks): the body's iterator is cancelled, and its cleanup cancels the job. The headers
    go with the first event, not before it: a request still waiting in the queue has been sent
    nothing, so a load balancer may send it to another replica if this one dies (docs/SERVER.md)."""
    media_type = "text/event-stream"

    async def stream_response(self, send: Send) -> None:
        started = False
        async for chunk in self.body_iterator:
            if not isinstance(chunk, bytes | memoryview):
                chunk = chunk.encode(self.charset)
            if not started:
                await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
                started = True
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        if not started:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as tasks:
            async def stream() -> None:
                await self.stream_response(send)
                tasks.cancel_scope.cancel()

            tasks.start_soon(stream)
            await self.listen_for_disconnect(receive)
            tasks.cancel_scope.cancel()


def create_app(model: Model, *, model_id: str | None = None, api_key: str | None = None, max_queue: int = 32,
               max_body: int = MAX_BODY, defaults: dict | None = None, parallel: int = 1) -> FastAPI:
    """The server's application for one model. defaults: sampling keyword arguments of
    Model.create_completion for requests that leave them out (the serve command's flags).
    parallel: requests answered at once, each in a sequence of its own (a KV cache each), their
    decoding steps run together (engine/batcher.py); 1: one at a time on the model itself."""
    model_id = model_id or model.name
    defaults = dict(defaults or {})
    batcher = Batcher(model.session, parallel) if parallel > 1 else None
    lanes = [model.view(s) for s in batcher.sequences] if batcher else [model]
    engine = Engine(max_queue, lanes, affinity=lambda lane, job: common_prefix(lane.session.tokens, job.prompt))
    metrics = Metrics(engine)
    started = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        engine.close()
        if batcher is not None:
            batcher.close()

    app = FastAPI(title="nanocompile", lifespan=lifespan, strict_content_type=False, docs_url=None, redoc_url=None,
                  openapi_url="/openapi.json")
    app.state.engine = engine
    app.add_middleware(FrontDoor, api_key=api_key, max_body=max_body)
    key_errors = (401,) if api_key else ()

    def responses(answer: type, *errors: int, stream: bool = False) -> dict:
        """The document's responses of an endpoint: its answer, and its errors in OpenAI's shape."""
        ok = {"model": answer, **({"content": {"text/event-stream": {"schema": STREAM_EVENT}},
                                  "description": "the answer; with stream, server-sent events"} if stream else {})}
        return {200: ok, **{status: {"model": schemas.ErrorBody, "description": ERRORS[status]} for status in errors}}

    def openapi() -> dict:
        """FastAPI's document, less the 422 it lists for a body (a request that fails validation
        is a 400 here), and with the API key as a bearer token on /v1/ if the server has one."""
        if app.openapi_schema is None:
            doc = FastAPI.openapi(app)
            for path, operations in doc["paths"].items():
                for operation in operations.values():
                    operation["responses"].pop("422", None)
                    if api_key and (path.startswith("/v1/") or path in KEYED):
                        operation["security"] = [{"api_key": []}]
            for name in ("HTTPValidationError", "ValidationError"):
                doc["components"]["schemas"].pop(name, None)
            if api_key:
                doc["components"]["securitySchemes"] = {"api_key": {"type": "http", "scheme": "bearer"}}
        return app.openapi_schema

    app.openapi = openapi

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _describe(exc.errors())
        return error_response(400, message, param=param)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        messages = {404: f"no such endpoint: {request.method} {request.url.path}",
                    405: f"{request.method} is not allowed on {request.url.path}"}
        if exc.status_code == 400 and exc.__cause__ is not None:  # FastAPI could not read the body
            messages[400] = f"the body is not valid JSON: {exc.__cause__}"
        return error_response(exc.status_code, messages.get(exc.status_code, str(exc.detail)),
                              "invalid_request_error" if exc.status_code < 500 else "server_error",
                              headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        # a bug: still OpenAI's JSON for the client (and Starlette still logs the traceback)
        return error_response(500, _internal(exc), "server_error")

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def chat_page() -> HTMLResponse:
        """A chat in the browser: one static page, no assets from elsewhere (chat.html)."""
        return HTMLResponse(CHAT_PAGE)

    @app.get("/health", responses=responses(schemas.Health))
    async def health() -> dict:
        state = {"status": "ok", "model": model_id, "n_ctx": model.n_ctx, **engine.state()}
        if batcher is not None:
            state["batch"] = batcher.stats.as_dict()
        return state

    @app.get("/metrics", response_class=Response,
             responses={200: {"content": {metrics_format.CONTENT_TYPE: {"schema": {"type": "string"}}},
                              "description": "Prometheus' text format"}})
    async def prometheus() -> Response:
        return Response(metrics.text(), media_type=metrics_format.CONTENT_TYPE)

    @app.post("/tokenize", responses=responses(schemas.Tokens, 400, *key_errors, 413))
    async def tokenize(body: schemas.TokenizeRequest) -> dict:
        try:
            ids = await run_in_threadpool(model.tokenize, body.content)
        except InputError as e:
            return error_response(400, str(e), param="content")
        if not body.with_pieces:
            return {"tokens": ids}
        return {"tokens": [{"id": t, "piece": model.tokenizer.token_bytes(t).decode("utf-8", errors="replace")}
                           for t in ids]}

    @app.post("/detokenize", responses=responses(schemas.Detokenized, 400, *key_errors, 413))
    async def detokenize(body: schemas.DetokenizeRequest) -> dict:
        try:
            return {"content": await run_in_threadpool(model.detokenize, body.tokens)}
        except InputError as e:
            return error_response(400, str(e), param="tokens")

    @app.get("/v1/models", responses=responses(schemas.ModelList, *key_errors))
    async def models() -> dict:
        return {"object": "list", "data": [{"id": model_id, "object": "model", "created": started,
                                             "owned_by": "nanocompile", "meta": {"n_ctx": model.n_ctx,
                                                                                 "n_vocab": model.n_vocab}}]}

    @app.post("/v1/completions", responses=responses(schemas.Completion, 400, *key_errors, 413, 500, 503,
                                                     stream=True))
    async def completions(body: CompletionRequest, request: Request) -> Response:
        def prompt_ids() -> tuple[list[int], list[int]]:
            prompt = body.prompt_value()
            if body.suffix is not None:
                return model.fim_prompt(prompt, body.suffix), model.fim_stop_token_ids()
            return (model.tokenize(prompt) if isinstance(prompt, str) else prompt), []

        return await answer(request, body, prompt_ids, body.max_tokens, fmt.completion_body, fmt.completion_events)

    @app.post("/v1/chat/completions", responses=responses(schemas.ChatCompletion, 400, *key_errors, 413, 500, 503,
                                                          stream=True))
    async def chat_completions(body: ChatRequest, request: Request) -> Response:
        try:  # compiling a forced call's grammar may take a while: off the event loop
            tools = await run_in_threadpool(tool_calls.plan, body.tools, body.tool_choice, model.tokenizer)
            if tools.grammar is not None and any(v is not None for v in body.constraint().values()):
                raise InputError(f"tool_choice {tools.choice!r} makes the answer a call: send no response_format, "
                                 "json_schema, grammar or format with it")
        except InputError as e:
            return error_response(400, str(e), param="tools")

        def prompt_ids() -> tuple[list[int], list[int]]:
            return model.chat_prompt([m.as_dict() for m in body.messages], tools.listed), []

        return await answer(request, body, prompt_ids, body.token_limit(),
                            lambda results, piece: fmt.chat_body(results, piece, tools.names), fmt.chat_events,
                            chat=True, forced=tools.grammar, tool_names=tools.names)

    def piece(token: int) -> bytes:
        return model.tokenizer.token_bytes(token)

    async def answer(request: Request, body: CompletionRequest | ChatRequest, prompt_ids: Callable,
                     max_tokens: int | None, whole: Callable, events: Callable, chat: bool = False,
                     forced: constrain.Grammar | None = None, tool_names=None) -> Response:
        """Checks, tokenizes and queues a request; answers with one JSON body or a stream. n
        choices run one after another (the later ones find the prompt in the cache), choice i
        with seed + i where the request has a seed."""
        if (problem := body.unsupported()) is not None:
            return error_response(400, problem)
        try:
            kwargs = sampling_kwargs(body)
            grammar = forced or await run_in_threadpool(constrain.from_request, **body.constraint())  # may take a while
            if grammar is not None:
                await run_in_threadpool(constrain.check_satisfiable, grammar, model.tokenizer, model.n_vocab)
            ids, stop_token_ids = await run_in_threadpool(prompt_ids)  # tokenizing is not for the event loop
            if not ids:
                raise InputError("the prompt is empty")
            if len(ids) > model.n_ctx:
                raise ContextFullError(f"the prompt has {len(ids)} tokens, more than the context of {model.n_ctx} "
                                       f"tokens (nanocompile serve -c sets it)")
            check_tokens(ids, model.n_vocab)
            # a request for more tokens than the context has room for stops when it is full ("length")
        except (InputError, ModelError) as e:
            return error_response(400, str(e), code="context_length_exceeded" if isinstance(e, ContextFullError)
                                  else None)

        arrived = time.monotonic()

        def work(should_stop, lane: Model):
            with generating(lane):
                for index in range(body.n):
                    seed = kwargs.get("seed")
                    choice = {**kwargs, **({"seed": (seed + index) % 2 ** 64} if seed is not None else {})}
                    begun = time.monotonic()
                    result = lane.create_completion(ids, max_tokens=max_tokens, stop_token_ids=stop_token_ids,
                                                    stream=body.stream, should_stop=should_stop, logprobs=body.top(),
                                                    grammar=grammar, **choice)
                    for item in result if body.stream else [result]:
                        if item.timings is not None:  # the choice's last chunk, or its whole answer
                            metrics.answered(item.timings, begun - arrived)
                        yield fmt.Choice(index, item)
                    if should_stop():
                        return

        try:
            job = engine.submit(work, ids)
        except QueueFull:
            return error_response(503, f"the server is busy: {engine.max_queue} requests are already waiting",
                                  "server_error", code="queue_full", headers={"Retry-After": "1"})
        except ShuttingDown:
            return error_response(503, "the server is shutting down", "server_error")
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        if body.stream:
            return EventStream(sse(job, events, include_usage, chat, tool_names))
        return await whole_answer(job, request, whole)

    async def whole_answer(job: Job, request: Request, whole: Callable) -> Response:
        result = asyncio.ensure_future(_all(job))
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({result, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not result.done():  # the client left (or the server stops): the request ends now
                engine.cancel(job)
                result.cancel()
        if not result.done() or result.cancelled():
            return Response(status_code=499)  # nobody is listening
        try:
            return JSONResponse(whole([choice.item for choice in result.result()], piece))
        except ShuttingDown:
            return error_response(503, "the server is shutting down", "server_error")
        except NanocompileError as e:
            return error_response(500, str(e), "server_error")

    async def sse(job: Job, events: Callable, include_usage: bool, chat: bool, tool_names=None) -> AsyncIterator[str]:
        state, last = fmt.StreamState(tool_names), None
        try:
            async for choice in job:
                for event in events(choice, state, piece):
                    yield f"data: {json.dumps(event, ensure_ascii=False)}\n\n"
                last = choice.item
            if include_usage and last is not None and state.usages:
                yield f"data: {json.dumps(state.usage_event(fmt.chunk_head(last, chat)), ensure_ascii=False)}\n\n"
            yield "data: [DONE]\n\n"
        except ShuttingDown:
            yield _error_event("the server is shutting down")
        except NanocompileError as e:
            yield _error_event(str(e))
        except Exception as e:  # a bug: the client is told in the stream, as of a fault
            yield _error_event(_internal(e))
        finally:
            engine.cancel(job)  # the client disconnected, or the job is over (then nothing happens)

    def sampling_kwargs(body: Sampling) -> dict:
        given = {k: getattr(body, k) for k in ("temperature", "top_p", "top_k", "min_p", "repeat_penalty",
                                               "frequency_penalty", "presence_penalty", "seed")}
        kwargs = {**defaults, **{k: v for k, v in given.items() if v is not None}}
        SamplingParams(**{**kwargs, "seed": kwargs.get("seed", -1)}).check(flag_names=False)
        return {**kwargs, "stop": body.stop}

    return app


def generating(lane: Model):
    """While a request generates in a sequence of a batcher, its rounds wait for it."""
    session = lane.session
    return session.generating() if hasattr(session, "batcher") else nullcontext()


async def _all(job: Job) -> list:
    items = [item async for item in job]
    if not items:
        raise ShuttingDown()
    return items


async def _disconnected(request: Request) -> None:
    """Returns when the client goes away (the body has been read: the next message says so)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _internal(e: Exception) -> str:
    return f"internal error: {type(e).__name__}: {e}"


def _error_event(message: str) -> str:
    error = {"message": message, "type": "server_error", "param": None, "code": None}
    return f"data: {json.dumps({'error': error})}\n\n"


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


def _describe(errors: list[dict]) -> tuple[str, str | None]:
    """A validation error as one line: the field and what is wrong with it. Of a union's errors, the
    one that went deepest into the input: a list of parts with a bad part is not "not a string"."""
    e = max(errors, key=lambda e: len(e.get("loc", ())))
    loc = [str(p) for p in e.get("loc", ()) if p != "body"]
    if e.get("type") == "json_invalid":
        return f"the body is not valid JSON: {e.get('ctx', {}).get('error', e.get('msg'))}", None
    if not loc and e.get("type") in ("missing", "model_attributes_type", "dict_type", "model_type"):
        return "the body must be a JSON object, sent with Content-Type: application/json", None
    # pydantic names the member of a union it tried (prompt.str): the field is what the client knows
    loc = [p for p in loc if p.isdigit() or (p.isidentifier() and not p[0].isupper() and p not in _TYPE_TAGS)]
    field = ".".join(loc) if loc else "body"
    got = e.get("input")
    shown = json.dumps(got)[:60] if isinstance(got, (str, int, float, bool, type(None))) else type(got).__name__
    return f"{field}: {e.get('msg', 'invalid')} (got {shown})", (loc[0] if loc else None)
