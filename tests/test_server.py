"""`nanocompile serve` with real clients over the loopback: the `openai` package against the real
model (a `nanocompile serve` process), and plain HTTP (httpx, raw sockets) against a tiny model
served in this process, for bad requests, the queue, disconnects and faults."""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import httpx
import openai
import pytest
from helpers import LiveServer
from session_wrappers import FaultySession, SlowSession

from nanocompile import Model
from nanocompile.engine.interpreted import InterpreterSession
from nanocompile.server import create_app
from nanocompile.target import detect_march

NC = [sys.executable, "-m", "nanocompile"]
KEY = "sk-test-key"
GREEDY = {"temperature": 0}


# a real `nanocompile serve` on the default model ----------------------------------------------------

SERVER_LOG: list[str] = []  # what the real server printed up to its serving line


@pytest.fixture(scope="module")
def real_server(real_model):
    p = subprocess.Popen([*NC, "serve", "-q", "--port", "0", "--api-key", KEY, "-c", "2048", "--precision", "f32"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines = []
    threading.Thread(target=lambda: lines.extend(p.stderr), daemon=True).start()  # drain its log
    end = time.time() + 300
    while not any("serving" in line for line in lines):
        assert p.poll() is None and time.time() < end, "".join(lines)
        time.sleep(0.1)
    port = re.search(r"http://127\.0\.0\.1:(\d+)/v1", "".join(lines)).group(1)
    SERVER_LOG[:] = lines
    yield f"http://127.0.0.1:{port}"
    p.send_signal(signal.SIGTERM)
    assert p.wait(60) == 0 and "the server stopped" in "".join(lines), "".join(lines)


@pytest.fixture(scope="module")
def reference(real_model, real_compiled):
    """The Python API on the same model: what the server must answer."""
    return Model.from_session(real_model, real_compiled)


def client(base: str, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=300)


def test_openai_chat_blocking_and_streaming(real_server, reference):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    want = reference.create_chat_completion(messages, max_tokens=12, **GREEDY)
    c = client(real_server)
    got = c.chat.completions.create(model="any-name", messages=messages, max_tokens=12, **GREEDY)
    assert got.choices[0].message.content == want.message.content and "Paris" in want.message.content
    assert got.choices[0].finish_reason == want.finish_reason and got.choices[0].message.role == "assistant"
    assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (want.usage.prompt_tokens,
                                                                      want.usage.completion_tokens)
    assert got.model == reference.name and got.id.startswith("chatcmpl-")
    chunks = list(c.chat.completions.create(model="any-name", messages=messages, max_tokens=12, stream=True,
                                            stream_options={"include_usage": True}, **GREEDY))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == want.message.content
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == want.finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == want.usage.total_tokens
    assert len({ch.id for ch in chunks}) == 1


def test_openai_completions_and_fill_in_the_middle(real_server, reference):
    c = client(real_server)
    want = reference.create_completion("def fibonacci(n):", max_tokens=10, **GREEDY)
    got = c.completions.create(model="x", prompt="def fibonacci(n):", max_tokens=10, **GREEDY)
    assert got.choices[0].text == want.text and got.usage.prompt_tokens == want.usage.prompt_tokens
    streamed = list(c.completions.create(model="x", prompt="def fibonacci(n):", max_tokens=10, stream=True,
                                         **GREEDY))
    assert "".join(ch.choices[0].text for ch in streamed) == want.text
    assert streamed[-1].choices[0].finish_reason == "length"
    # fill in the middle, as editor plugins ask for it: the suffix field
    prefix, suffix = "def add(a, b):\n    ", "\n\nprint(add(1, 2))\n"
    middle = reference.create_completion(prefix, suffix=suffix, max_tokens=6, **GREEDY)
    got = c.completions.create(model="x", prompt=prefix, suffix=suffix, max_tokens=6, **GREEDY)
    assert got.choices[0].text == middle.text and middle.text.startswith("return a + b")
    assert got.usage.prompt_tokens == len(reference.fim_prompt(prefix, suffix))


def test_openai_logprobs_and_several_choices(real_server, reference):
    """The openai client reads the server's log-probabilities in both shapes; they are the Python
    API's numbers (the same library: the same logits bit for bit); greedy choices are alike."""
    c = client(real_server)
    messages = [{"role": "user", "content": "Name a sorting algorithm."}]
    want = reference.create_chat_completion(messages, max_tokens=6, logprobs=True, top_logprobs=3, **GREEDY)
    got = c.chat.completions.create(model="x", messages=messages, max_tokens=6, logprobs=True, top_logprobs=3, n=2,
                                    **GREEDY)
    assert [ch.message.content for ch in got.choices] == [want.message.content] * 2
    content = got.choices[1].logprobs.content
    assert [e.logprob for e in content] == [lp.logprob for lp in want.logprobs]
    assert [[t.logprob for t in e.top_logprobs] for e in content] == [[v for _, v in lp.top] for lp in want.logprobs]
    assert content[0].token == reference.tokenizer.token_bytes(want.tokens[0]).decode()
    text = reference.create_completion("def add(a, b):", max_tokens=5, logprobs=2, **GREEDY)
    legacy = c.completions.create(model="x", prompt="def add(a, b):", max_tokens=5, logprobs=2, **GREEDY)
    assert legacy.choices[0].logprobs.token_logprobs == [lp.logprob for lp in text.logprobs]
    assert "".join(legacy.choices[0].logprobs.tokens) == text.text


def test_a_two_turn_tool_loop_with_the_openai_client(real_server):
    """The model asks for the weather through the template's <tool_call>; the client runs the tool
    and sends the answer back as a `tool` message; the model answers with it. Streamed, the call
    arrives as a tool_calls delta."""
    c = client(real_server)
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = c.chat.completions.create(model="x", messages=messages, tools=[WEATHER], max_tokens=60, **GREEDY)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] == "Paris"
    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "18 degrees Celsius, sunny"}]
    second = c.chat.completions.create(model="x", messages=messages, tools=[WEATHER], tool_choice="none",
                                       max_tokens=60, **GREEDY)
    assert second.choices[0].finish_reason == "stop" and "18" in second.choices[0].message.content
    chunks = list(c.chat.completions.create(model="x", messages=messages[:1], tools=[WEATHER], max_tokens=60,
                                            stream=True, **GREEDY))
    deltas = [d for ch in chunks if ch.choices for d in ch.choices[0].delta.tool_calls or []]
    assert deltas[0].function.name == "get_weather"
    assert json.loads("".join(d.function.arguments for d in deltas)) == json.loads(call.function.arguments)
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "tool_calls"


def test_langchains_openai_client_calls_a_tool(real_server):
    """An agent framework's OpenAI-compatible client: LangChain's ChatOpenAI with a bound tool gets
    the call as its own tool_calls, then answers from the tool's result."""
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        return "18 degrees Celsius, sunny"

    llm = ChatOpenAI(base_url=real_server + "/v1", api_key=KEY, model="x", temperature=0, max_tokens=60,
                     max_retries=0, timeout=300)
    question = HumanMessage("What is the weather in Paris?")
    asked = llm.bind_tools([get_weather]).invoke([question])
    (call,) = asked.tool_calls
    assert call["name"] == "get_weather" and call["args"]["city"] == "Paris"
    answer = llm.bind_tools([get_weather], tool_choice="none").invoke(
        [question, asked, ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])])
    assert "18" in answer.content and not answer.tool_calls


def test_structured_output_with_the_openai_clients_parse(real_server):
    """OpenAI's client.chat.completions.parse with a pydantic model sends a strict json_schema
    response_format and parses the answer into the model: it parses, and validates."""
    import pydantic

    class Book(pydantic.BaseModel):
        title: str = pydantic.Field(max_length=40)
        year: int = pydantic.Field(ge=1450, le=2030)
        genres: list[str] = pydantic.Field(max_length=3)

    c = client(real_server)
    got = c.chat.completions.parse(model="x", messages=[{"role": "user", "content": "A famous novel, as JSON."}],
                                   response_format=Book, max_tokens=100, **GREEDY)
    book = got.choices[0].message.parsed
    assert isinstance(book, Book) and 1450 <= book.year <= 2030 and len(book.genres) <= 3
    # llama.cpp's and Ollama's fields, on completions
    for extra in ({"json_schema": {"type": "object", "properties": {"n": {"type": "integer", "maximum": 999}},
                                   "required": ["n"], "additionalProperties": False}},
                  {"grammar": 'root ::= "yes" | "no"'},
                  {"format": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                              "additionalProperties": False}}):
        r = httpx.post(real_server + "/v1/completions", json={"prompt": "Answer:", "max_tokens": 30, **extra, **GREEDY},
                       headers={"Authorization": f"Bearer {KEY}"}, timeout=120).json()
        text = r["choices"][0]["text"]
        assert text in ("yes", "no") if "grammar" in extra else isinstance(json.loads(text), dict), (extra, text)


def test_stop_sequences_seed_and_models(real_server):
    c = client(real_server)
    sampled = dict(model="x", prompt="import", max_tokens=8, temperature=1.0, top_p=1.0)
    a, b = (c.completions.create(seed=11, **sampled).choices[0].text for _ in range(2))
    assert a == b
    stopped = c.completions.create(model="x", prompt="def f(x):\n    return x\n\n\ndef g(y):", max_tokens=30,
                                   stop=["\n"], **GREEDY)
    assert "\n" not in stopped.choices[0].text and stopped.choices[0].finish_reason == "stop"
    assert [m.id for m in c.models.list().data] == ["qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"]


def test_the_real_server_drafts_by_default_where_its_library_runs_16_lane_vnni(real_server):
    """Issue 27, point 5: prompt lookup is on by default in the server where a verify step's rows
    are cheap (16-lane VNNI products) and off elsewhere; the serving line says which."""
    serving = next(line for line in SERVER_LOG if "serving" in line)
    march = detect_march()[0]
    assert ("prompt lookup on" in serving) == march.startswith("x86-64-v4+vnni"), (march, serving)


@pytest.mark.parametrize("flag, march, on", [
    (None, "x86-64-v4+vnni", True), (None, "x86-64-v4+vnni+amx", True), (None, "x86-64-v3", False),
    (None, "x86-64-v3+vnni", False), (None, "x86-64-v4", False), (None, None, False),
    (False, "x86-64-v4+vnni", False), (True, "x86-64-v3", True)])
def test_serve_lookup_default_and_flags(flag, march, on):
    """`serve` without --lookup or --no-lookup drafts only on 16-lane VNNI libraries (None: the
    interpreter); --no-lookup turns the default off; --lookup's parameters reach the default."""
    from nanocompile.cli import build_parser
    from nanocompile.cli.common import lookup_from
    from nanocompile.cli.serve import default_lookup

    argv = ["serve", "--draft-max", "5"] + {None: [], True: ["--lookup"], False: ["--no-lookup"]}[flag]
    args = build_parser().parse_args(argv)
    model = SimpleNamespace(session=SimpleNamespace(march=march) if march else SimpleNamespace(),
                            lookup=lookup_from(args) or None)
    default_lookup(args, model)
    assert bool(model.lookup) == on and (not on or model.lookup.draft_max == 5)


def test_api_key_and_health(real_server):
    with pytest.raises(openai.AuthenticationError):
        client(real_server, key="wrong").models.list()
    r = httpx.post(real_server + "/v1/completions", json={"prompt": "x"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert r.headers["www-authenticate"] == "Bearer"
    health = httpx.get(real_server + "/health").json()  # open: load balancers probe it without a key
    assert health["status"] == "ok" and health["n_ctx"] == 2048


def test_a_prompt_longer_than_the_context_is_a_400_with_the_reason(real_server):
    with pytest.raises(openai.BadRequestError, match="the prompt has 2100 tokens, more than the context of 2048"):
        client(real_server).completions.create(model="x", prompt="7" * 2100, max_tokens=1)


def test_a_client_that_disconnects_mid_stream_frees_the_server(real_server):
    before = httpx.get(real_server + "/health").json()
    body = {"prompt": "Count from 1 to 1000:", "max_tokens": 1000, "stream": True, **GREEDY}
    with httpx.stream("POST", real_server + "/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"},
                      timeout=120) as r:
        events = 0
        for line in r.iter_lines():
            events += line.startswith("data: ")
            if events == 3:
                break  # leaving the block closes the connection mid-stream
    end = time.time() + 120
    while (health := httpx.get(real_server + "/health").json())["busy"]:
        assert time.time() < end
        time.sleep(0.2)
    assert health["requests"]["cancelled"] == before["requests"]["cancelled"] + 1
    assert health["tokens_generated"] - before["tokens_generated"] < 100  # of the 1000 asked for
    assert client(real_server).completions.create(model="x", prompt="1, 2,", max_tokens=2).choices[0].text


# a tiny model served in this process ----------------------------------------------------------------

def tiny_server(tiny_chat_model, wrap=None, **options) -> LiveServer:
    """A LiveServer of the tiny model (interpreter), its session wrapped by wrap."""
    session = InterpreterSession.from_weights(tiny_chat_model.config, tiny_chat_model.weights, n_ctx=256)
    return LiveServer(create_app(Model.from_session(tiny_chat_model, wrap(session) if wrap else session), **options))


@pytest.fixture()
def serve_tiny(tiny_chat_model):
    """serve_tiny(wrap=..., **create_app options) -> a LiveServer of the tiny model (interpreter)."""
    servers = []

    def start(wrap=None, **options):
        servers.append(tiny_server(tiny_chat_model, wrap, **options))
        return servers[-1]

    yield start
    for s in servers:
        s.stop()


@pytest.fixture(scope="module")
def refusing_server(tiny_chat_model):
    """One server for every bad-request case: a refused request queues nothing, so each case still
    sees no request done (and a server per case cost 0.4 s to start and stop)."""
    server = tiny_server(tiny_chat_model)
    yield server
    server.stop()


def post(server, path, body, **kw):
    if isinstance(body, (bytes, str)):
        return httpx.post(server.url + path, content=body, headers={"Content-Type": "application/json"}, **kw)
    return httpx.post(server.url + path, json=body, **kw)


@pytest.mark.parametrize("path, body, message", [
    ("/v1/completions", b'{"prompt": "x", ', "the body is not valid JSON"),
    ("/v1/completions", b"", "the body must be a JSON object"),
    ("/v1/completions", b"[1, 2]", "the body must be a JSON object"),
    ("/v1/completions", {"prompt": 5}, "prompt: Input should be a valid string (got 5)"),
    ("/v1/completions", {"prompt": "x", "max_tokens": "many"},
     'max_tokens: Input should be a valid integer (got "many")'),
    ("/v1/completions", {"prompt": "x", "max_tokens": -1}, "max_tokens: Input should be greater than or equal to 0"),
    ("/v1/completions", {"prompt": "x", "temperature": 3}, "temperature: Input should be less than or equal to 2"),
    ("/v1/completions", {"prompt": "x", "top_k": 1.5}, "top_k: Input should be a valid integer"),
    ("/v1/completions", {"prompt": "x", "stream": "yes"}, "stream: Input should be a valid boolean"),
    ("/v1/completions", {"prompt": "x", "n": 9}, "n: Input should be less than or equal to 8"),
    ("/v1/completions", {"prompt": "x", "n": 0}, "n: Input should be greater than or equal to 1"),
    ("/v1/completions", {"prompt": "x", "logprobs": 21}, "logprobs: Input should be less than or equal to 20"),
    ("/v1/completions", {"prompt": "x", "logprobs": True}, "logprobs: Input should be a valid integer"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 3},
     "top_logprobs needs logprobs: true"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": -1},
     "top_logprobs: Input should be greater than or equal to 0"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": 2},
     "logprobs: Input should be a valid boolean"),
    ("/v1/completions", {"prompt": "x", "echo": True}, "echo is not supported"),
    ("/v1/completions", {"prompt": ["a", "b"]}, "prompt"),
    ("/v1/completions", {"prompt": [1, 999]}, "token id 999 at position 1 is outside the vocabulary"),
    ("/v1/completions", {"prompt": "x", "suffix": "y"}, "has no fill-in-the-middle tokens"),
    ("/v1/completions", {"prompt": "a" * 300}, "the prompt has 300 tokens, more than the context of 256"),
    ("/v1/chat/completions", {"messages": []}, "messages: List should have at least 1 item"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role: Input should be"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages.0.content"),
    # tools
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
     "tools.0: {\"type\": \"function\", \"function\""),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
     "tools.0.function.parameters: an object schema"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
            "a": {"type": "integerx"}}}}}]}, "tools.0.function.parameters: Invalid type: integerx"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": [
        {"type": "function", "function": {"name": "has space"}}]}, "tools.0.function.name: 1 to 64 letters"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": [
        {"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {
            "name": "g"}}}, "tool_choice: no function named 'g' in tools (f)"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"},
     "tool_choice: 'required' needs tools"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": [
        {"type": "function", "function": {"name": "f"}}], "tool_choice": "always"}, "tool_choice: auto, none"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": [
        {"type": "function", "function": {"name": "f"}}], "tool_choice": "required",
        "response_format": {"type": "json_object"}}, "makes the answer a call: send no response_format"),
    ("/v1/chat/completions", {"messages": [{"role": "tool", "content": "x"}], "tools": "f"},
     "tools: Input should be a valid list"),
    # constrained decoding: a schema or grammar llguidance cannot compile, named by its field
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "response_format": {
        "type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "objectx"}}}},
     "response_format.json_schema.schema: Invalid type: objectx"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}},
     "response_format.type: one of text, json_object, json_schema"),
    ("/v1/completions", {"prompt": "x", "grammar": "root ::= ("}, "grammar: the GBNF grammar does not parse"),
    ("/v1/completions", {"prompt": "x", "json_schema": {"type": "object"}, "grammar": 'root ::= "a"'},
     "json_schema and grammar: give one of them, not both"),
    ("/v1/completions", {"prompt": "x", "format": "yaml"}, 'format: "json" or a JSON schema'),
    ("/v1/completions", {"prompt": "x", "json_schema": {"type": "object", "properties": {"a": {
        "type": "integer", "minimum": 3, "maximum": 1}}, "required": ["a"]}}, "unsatisfiable"),
    # what Python's JSON reader takes, or fails on other than as malformed JSON
    ("/v1/completions", b'{"prompt": "x", "temperature": NaN}', "temperature: Input should be a finite number"),
    ("/v1/completions", b'{"prompt": "x", "suffix": "\\ud800"}', "suffix: the character at 0 is a lone surrogate"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "a\\udfff"}]}]}',
     "messages.0.content.0.text: the character at 1 is a lone surrogate"),
    ("/v1/completions", b'{"prompt": "\xff"}', "the body is not valid JSON: 'utf-8' codec can't decode byte 0xff"),
    ("/v1/completions", b"[" * 5000 + b"]" * 5000, "the body is not valid JSON: maximum recursion depth exceeded"),
    ("/v1/completions", {"prompt": ""}, "prompt: String should have at least 1 character"),
])
def test_bad_requests_get_a_400_naming_the_fault(refusing_server, path, body, message):
    server = refusing_server
    r = post(server, path, body)
    error = r.json()["error"]
    assert r.status_code == 400 and message in error["message"] and error["type"] == "invalid_request_error", error
    assert server.health()["requests"]["done"] == 0  # nothing was queued


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "hello", "max_tokens": 5, "temperature": 5e-324}),
    ("/v1/chat/completions", {"messages": [{"role": "user"}], "max_tokens": 5, "repeat_penalty": 5e-324}),
])
def test_extreme_sampling_values_are_answered_not_a_500(serve_tiny, path, body):
    # found by the fuzzer (tests/test_server_fuzz.py): logits overflowed to infinity, then NaN
    server = serve_tiny()
    r = post(server, path, body)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 5, r.text
    if "temperature" in body:  # so small a temperature is greedy
        assert r.json()["choices"][0]["text"] == post(server, path, {**body, **GREEDY}).json()["choices"][0]["text"]
    assert server.health()["requests"]["failed"] == 0


def test_several_choices_each_with_its_seed_and_their_log_probabilities(serve_tiny, tiny_chat_model):
    """n choices: choice i is the Python API's answer with seed + i; logprobs in each endpoint's
    shape, the numbers the API gives; streamed, each choice's chunks carry its index and add up
    to the whole answer; usage counts the prompt once."""
    server = serve_tiny()
    reference = Model.from_session(tiny_chat_model, InterpreterSession.from_weights(
        tiny_chat_model.config, tiny_chat_model.weights, n_ctx=256))
    sampled = {"max_tokens": 6, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
    body = {"prompt": "hello", "n": 3, "seed": 40, "logprobs": 2, **sampled}
    got = post(server, "/v1/completions", body).json()
    want = []
    for i in range(3):
        reference.reset()  # each alone, as from an empty cache (the interpreter rounds by the step's rows)
        want.append(reference.create_completion("hello", seed=40 + i, logprobs=2, **sampled))
    assert [c["index"] for c in got["choices"]] == [0, 1, 2]
    assert [c["text"] for c in got["choices"]] == [w.text for w in want]
    assert len({c["text"] for c in got["choices"]}) > 1  # three seeds, not one answer three times
    for c, w in zip(got["choices"], want):
        lp = c["logprobs"]
        assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(w.tokens)
        assert all(abs(a - b.logprob) < 1e-6 for a, b in zip(lp["token_logprobs"], w.logprobs))
        assert all(len(top) <= 2 for top in lp["top_logprobs"]) and lp["text_offset"][0] == 0
    assert got["usage"]["prompt_tokens"] == want[0].usage.prompt_tokens
    assert got["usage"]["completion_tokens"] == sum(w.usage.completion_tokens for w in want)

    chat = {"messages": [{"role": "user", "content": "hi"}], "n": 2, "seed": 8, "logprobs": True, "top_logprobs": 3,
            **sampled}
    whole = post(server, "/v1/chat/completions", chat).json()
    for c in whole["choices"]:
        content = c["logprobs"]["content"]
        assert content and all(len(e["top_logprobs"]) == 3 and e["logprob"] <= 0 for e in content)
        assert all(bytes(e["bytes"]).decode("utf-8", "replace") == e["token"] for e in content)
    events = []
    with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=60,
                      json={**chat, "stream": True, "stream_options": {"include_usage": True}}) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    for c in whole["choices"]:
        mine = [e["choices"][0] for e in events if e["choices"] and e["choices"][0]["index"] == c["index"]]
        assert mine[0]["delta"]["role"] == "assistant" and mine[-1]["finish_reason"] == c["finish_reason"]
        assert "".join(m["delta"].get("content") or "" for m in mine) == c["message"]["content"]
        streamed = [x for m in mine if m["logprobs"] for x in m["logprobs"]["content"]]
        # the same tokens; the numbers within the interpreter's rounding of a step by its rows (the
        # cache holds the whole answer's conversation, so the prompt's last token is fed alone)
        assert [e["token"] for e in streamed] == [e["token"] for e in c["logprobs"]["content"]]
        assert all(abs(a["logprob"] - b["logprob"]) < 1e-5 for a, b in zip(streamed, c["logprobs"]["content"]))
    assert events[-1]["choices"] == [] and events[-1]["usage"] == whole["usage"]


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"], "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {"name": "now", "parameters": {
    "type": "object", "properties": {"zone": {"type": "integer", "minimum": -12, "maximum": 14}},
    "required": ["zone"], "additionalProperties": False}}}


def test_a_required_tool_call_always_parses_and_matches_its_parameters(serve_tiny):
    """tool_choice required or named: the grammar makes the answer a call of an allowed function
    whose arguments match its schema, for every seed of noise from the random model, whole and
    streamed (one delta per call, joined by the client)."""
    import jsonschema

    server = serve_tiny()
    params = {f["function"]["name"]: f["function"]["parameters"] for f in (WEATHER, CLOCK)}
    for seed, choice in enumerate(["required"] * 4 + [{"type": "function", "function": {"name": "now"}}] * 2):
        body = {"messages": [{"role": "user", "content": "x"}], "tools": [WEATHER, CLOCK], "tool_choice": choice,
                "max_tokens": 120, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": seed}
        got = post(server, "/v1/chat/completions", body).json()["choices"][0]
        assert got["finish_reason"] == "tool_calls" and got["message"]["content"] is None, got
        (call,) = got["message"]["tool_calls"]
        assert call["type"] == "function" and call["id"].startswith("call_")
        if isinstance(choice, dict):
            assert call["function"]["name"] == "now"
        jsonschema.validate(json.loads(call["function"]["arguments"]), params[call["function"]["name"]])
        with httpx.stream("POST", server.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=60) as r:
            events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
        deltas = [d for e in events for d in e["choices"][0]["delta"].get("tool_calls", [])]
        assert [(d["function"]["name"], d["function"]["arguments"]) for d in deltas] == [
            (call["function"]["name"], call["function"]["arguments"])]
        assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"
        assert not "".join(e["choices"][0]["delta"].get("content") or "" for e in events)


def test_tokenize_detokenize_and_metrics(serve_tiny, tiny_chat_model):
    """llama-server's /tokenize and /detokenize (the tokenizer's ids, behind the key) and /metrics in
    Prometheus' format (open, like /health), whose counts follow the requests answered."""
    from prometheus_client.parser import text_string_to_metric_families

    server = serve_tiny(api_key=KEY)
    auth = {"headers": {"Authorization": f"Bearer {KEY}"}}
    text = "hello <|im_end|> world"
    want = tiny_chat_model.tokenizer.encode(text)
    assert post(server, "/tokenize", {"content": text}, **auth).json() == {"tokens": want}
    pieces = post(server, "/tokenize", {"content": text, "with_pieces": True}, **auth).json()["tokens"]
    assert [p["id"] for p in pieces] == want and "".join(p["piece"] for p in pieces) == text
    assert post(server, "/detokenize", {"tokens": want}, **auth).json() == {"content": text}
    assert post(server, "/tokenize", {"content": text}).status_code == 401
    bad = post(server, "/detokenize", {"tokens": [1, 10 ** 6]}, **auth)
    assert bad.status_code == 400 and "outside the vocabulary" in bad.json()["error"]["message"]
    assert post(server, "/tokenize", {"content": 5}, **auth).json()["error"]["message"].startswith("content:")

    def scrape() -> dict:
        r = httpx.get(server.url + "/metrics")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        return {(s.name, s.labels.get("outcome", "")): s.value for f in text_string_to_metric_families(r.text)
                for s in f.samples}

    before = scrape()
    assert before[("nanocompile_requests_total", "done")] == 0 and before[("nanocompile_queue_length", "")] == 0
    for _ in range(2):
        post(server, "/v1/completions", {"prompt": "hello", "max_tokens": 4, **GREEDY}, **auth)
    after = scrape()
    assert after[("nanocompile_requests_total", "done")] == 2
    assert after[("nanocompile_tokens_generated_total", "")] == 8
    assert after[("nanocompile_time_to_first_token_seconds_count", "")] == 2
    assert after[("nanocompile_decode_tokens_per_second_count", "")] == 2
    fed, cached = after[("nanocompile_prompt_tokens_total", "")], after[("nanocompile_prompt_tokens_cached_total", "")]
    assert fed + cached == 2 * len(tiny_chat_model.tokenizer.encode("hello")) and cached > 0  # the second reused it


def test_unknown_fields_are_ignored_and_known_ones_still_apply(serve_tiny):
    server = serve_tiny()
    plain = post(server, "/v1/completions", {"prompt": "hello", "max_tokens": 5, **GREEDY}).json()
    extra = post(server, "/v1/completions", {"prompt": "hello", "max_tokens": 5, **GREEDY, "cache_prompt": True,
                                             "keep_alive": "5m", "options": {"num_ctx": 4096}}).json()
    assert extra["choices"][0]["text"] == plain["choices"][0]["text"]
    assert extra["usage"]["completion_tokens"] == plain["usage"]["completion_tokens"] == 5


def test_huge_bodies_are_refused_before_they_are_read(serve_tiny):
    server = serve_tiny(max_body=1 << 20)
    big = json.dumps({"prompt": "x" * (2 << 20)})
    r = post(server, "/v1/completions", big)
    assert r.status_code == 413 and r.json()["error"]["message"].startswith(
        f"the request body has {len(big)} bytes: the limit is 1048576 bytes")

    def chunked():  # no Content-Length: counted as it arrives
        for _ in range(3):
            yield b"x" * (1 << 19)

    r = httpx.post(server.url + "/v1/completions", content=chunked(), headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and "has more than 1048576 bytes: the limit is" in r.json()["error"]["message"]
    assert server.health()["status"] == "ok"


def stream_open(server, body):
    """A streaming request whose response has begun; returns (context manager, line iterator)."""
    cm = httpx.stream("POST", server.url + "/v1/completions", json={**body, "stream": True}, timeout=60)
    response = cm.__enter__()
    assert response.status_code == 200
    return cm, response.iter_lines()


def stream_lines(server, body) -> list[str]:
    with httpx.stream("POST", server.url + "/v1/completions", json={**body, "stream": True}, timeout=60) as r:
        return list(r.iter_lines())


def waiting_request(server, body) -> socket.socket:
    """A streaming request sent over a socket of its own, its answer not read: one that waits in
    the queue (whose response has not begun) and can hang up."""
    host, port = server.url[len("http://"):].split(":")
    data = json.dumps({**body, "stream": True}).encode()
    s = socket.create_connection((host, int(port)))
    s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return s


def wait_for(server, condition, timeout=30.0) -> dict:
    end = time.time() + timeout
    while not condition(health := server.health()):
        assert time.time() < end, health
        time.sleep(0.05)
    return health


def test_a_full_queue_answers_503_and_a_client_that_leaves_frees_its_place_at_once(serve_tiny):
    server = serve_tiny(wrap=lambda s: SlowSession(s, 0.05), max_queue=1)
    long = {"prompt": "hello", "max_tokens": 200, **GREEDY}  # 200 steps of at least 50 ms: 10 s or more
    a, a_lines = stream_open(server, long)
    next(line for line in a_lines if line.startswith("data: "))  # A is being answered
    b = waiting_request(server, long)  # B waits: its response (headers too) comes with its first token
    wait_for(server, lambda h: h["queued"] == 1)
    full = post(server, "/v1/completions", long)
    assert full.status_code == 503 and full.headers["retry-after"] == "1"
    assert full.json()["error"]["code"] == "queue_full"
    b.close()  # B hangs up while it waits: its place is free while A still runs
    health = wait_for(server, lambda h: h["queued"] == 0)
    assert health["busy"] and health["requests"]["cancelled"] == 1
    d_lines = []  # D waits in a thread of its own: its response begins when it runs
    d = threading.Thread(target=lambda: d_lines.extend(
        stream_lines(server, {"prompt": "hi", "max_tokens": 3, **GREEDY})))
    d.start()
    wait_for(server, lambda h: h["queued"] == 1)
    a.__exit__(None, None, None)  # A hangs up: generation stops at its next token, D runs
    d.join(60)
    lines = [line for line in d_lines if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and json.loads(lines[-2][6:])["choices"][0]["finish_reason"] == "length"
    health = wait_for(server, lambda h: not h["busy"])
    assert health["requests"] == {"done": 1, "cancelled": 2, "failed": 0, "rejected": 1}
    assert health["tokens_generated"] < 200 + 3  # A did not run to its end


def test_abrupt_disconnects_of_any_kind_leave_the_server_working(serve_tiny):
    server = serve_tiny(wrap=lambda s: SlowSession(s, 0.05))
    host, port = server.url[len("http://"):].split(":")
    body = json.dumps({"prompt": "hello", "max_tokens": 200, **GREEDY}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    for sent in (head[:10], head, head + body[:5]):  # mid-headers, before the body, mid-body
        with socket.create_connection((host, int(port))) as s:
            s.sendall(sent)
    with socket.create_connection((host, int(port))) as s:  # a whole non-streaming request, then gone
        s.sendall(head + body)
        wait_for(server, lambda h: h["busy"])
    health = wait_for(server, lambda h: not h["busy"])
    assert health["requests"]["cancelled"] == 1 and health["tokens_generated"] < 200
    r = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 2


def test_non_finite_logits_are_a_500_naming_the_step_and_the_server_goes_on(serve_tiny):
    server = serve_tiny(wrap=lambda s: FaultySession(s, at=3))
    r = post(server, "/v1/completions", {"prompt": "hello", "max_tokens": 10, **GREEDY})
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    assert "the logits of step 3 (after generated token 2) are not finite" in r.json()["error"]["message"]
    assert post(server, "/v1/completions", {"prompt": "hello", "max_tokens": 10, **GREEDY}).status_code == 200
    server = serve_tiny(wrap=lambda s: FaultySession(s, at=3))
    with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=60,
                      json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10, "stream": True,
                            **GREEDY}) as r:  # sampled, the tiny model may end its turn before step 3
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert "step 3" in events[-1]["error"]["message"]  # and no [DONE]
    assert all("choices" in e for e in events[:-1]) and server.health()["requests"]["failed"] == 1


@pytest.mark.slow
def test_concurrent_clients_are_all_answered_once_in_turn(serve_tiny, tiny_chat_model):
    server = serve_tiny(max_queue=16)
    prompts = [f"prompt number {i}" for i in range(8)]
    results = {}

    def ask(p):
        results[p] = post(server, "/v1/completions", {"prompt": p, "max_tokens": 6, **GREEDY}, timeout=60)

    threads = [threading.Thread(target=ask, args=(p,)) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(r.status_code == 200 for r in results.values())
    assert len({r.json()["id"] for r in results.values()}) == len(prompts)
    reference = Model.from_session(tiny_chat_model, InterpreterSession.from_weights(tiny_chat_model.config,
                                                                       tiny_chat_model.weights, n_ctx=256))
    for p, r in results.items():
        reference.reset()
        assert r.json()["choices"][0]["text"] == reference.create_completion(p, max_tokens=6, **GREEDY).text
    assert server.health()["requests"]["done"] == len(prompts)


@pytest.mark.slow
def test_serve_refuses_a_port_in_use_before_loading_the_model():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        r = subprocess.run([*NC, "serve", "-m", "/nonexistent.gguf", "--port", str(port)], capture_output=True,
                           text=True, timeout=60)
    assert r.returncode == 1 and f"cannot listen on 127.0.0.1:{port}" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([*NC, "serve", "--queue", "-1"], capture_output=True, text=True, timeout=60,
                       env={**os.environ})
    assert r.returncode == 1 and "--queue must be >= 0" in r.stderr
    # without --lookup too: the server may draft by default, so its parameters are checked first
    r = subprocess.run([*NC, "serve", "-m", "/nonexistent.gguf", "--draft-max", "0"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and "--draft-max must be a whole number of at least 1, got 0" in r.stderr
    assert "Traceback" not in r.stderr and "/nonexistent.gguf" not in r.stderr
