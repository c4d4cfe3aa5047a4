"""The HTTP API fuzzed from its own OpenAPI document. Schemathesis reads /openapi.json from the
server and sends every endpoint requests generated from it: valid bodies and invalid ones (wrong
types, missing fields, values out of range, bodies that are not JSON objects: schemathesis'
positive and negative generation modes, as hypothesis strategies), each once without the API key and once with it (schemathesis drops the key itself
where it tests a missing one). Whatever a client sends, the answer is never a 5xx; every 4xx is
OpenAI's error, {"error": {"message", "type", "param", "code"}}; every answer is what the document
says (status, content type, headers, body). Afterwards /health says ok, with request counts that
add up to the answers the fuzzer got.

The server is uvicorn on the loopback, as `nanocompile serve` runs it (an application called
in-process has its lifespan ended by schemathesis after each test, and the engine stops with it). The tiny random model on the interpreter, in a context of 32 tokens (a full context
stops a generation), keeps each request cheap; the examples per endpoint are bounded and
derandomized, so every run sends the same requests. What schemathesis does not send (NaN, lone
surrogates, nesting too deep to read) is in test_server.py's list of bad requests.
"""
from __future__ import annotations

import time
from collections import Counter

import pytest
import schemathesis
from helpers import LiveServer
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (content_type_conformance, response_headers_conformance,
                                               response_schema_conformance, status_code_conformance)

from nanocompile import Model
from nanocompile.engine.interpreted import InterpreterSession
from nanocompile.server import create_app

pytestmark = pytest.mark.slow  # hundreds of generated requests

KEY = "sk-fuzz-key"
N_CTX = 32  # a chat without max_tokens runs until the context is full (the template takes 19)
GENERATING = {"/v1/completions", "/v1/chat/completions"}
EXAMPLES = 50  # per operation and mode
# what the server answers must be what the document says; schemathesis' other default checks
# expect a valid request to succeed, but a valid body can still be refused (a token id outside
# the vocabulary, a prompt longer than the context, echo: true), with a 400
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance]


@pytest.fixture(scope="module")
def served(tiny_chat_model):
    """The tiny model's server, with a tally of the answers the fuzzer got: (path, status) -> count,
    and the tokens of the whole (not streamed) completions."""
    session = InterpreterSession.from_weights(tiny_chat_model.config, tiny_chat_model.weights, n_ctx=N_CTX)
    server = LiveServer(create_app(Model.from_session(tiny_chat_model, session), api_key=KEY))
    server.answers, server.tokens = Counter(), 0
    yield server
    server.stop()


@pytest.fixture(scope="module")
def api(served):
    return schemathesis.openapi.from_url(served.url + "/openapi.json")  # no key: open, as /health is


def test_the_document_describes_every_endpoint_and_body(api):
    doc = api.raw_schema
    assert {(path, method) for path, ops in doc["paths"].items() for method in ops} == {
        ("/v1/completions", "post"), ("/v1/chat/completions", "post"), ("/v1/models", "get"), ("/health", "get"),
        ("/metrics", "get"), ("/tokenize", "post"), ("/detokenize", "post")}
    bodies = {path: ops["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
              for path, ops in doc["paths"].items() if "post" in ops}
    assert bodies == {"/v1/completions": "#/components/schemas/CompletionRequest",
                      "/v1/chat/completions": "#/components/schemas/ChatRequest",
                      "/tokenize": "#/components/schemas/TokenizeRequest",
                      "/detokenize": "#/components/schemas/DetokenizeRequest"}
    schemas = doc["components"]["schemas"]
    assert schemas["CompletionRequest"]["required"] == ["prompt"]
    assert schemas["ChatRequest"]["required"] == ["messages"]
    # bounds are stated as JSON Schema's, so that a client (and the fuzzer) can see them
    assert schemas["CompletionRequest"]["properties"]["temperature"]["anyOf"][0] == {
        "type": "number", "minimum": 0, "maximum": 2}
    for path in GENERATING:
        errors = doc["paths"][path]["post"]["responses"]
        assert {"400", "401", "413", "503"} <= errors.keys() and "422" not in errors
        assert errors["400"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorBody"}
    for path, method in (("/v1/models", "get"), ("/tokenize", "post"), ("/detokenize", "post")):
        assert doc["paths"][path][method]["security"] == [{"api_key": []}]
    assert "security" not in doc["paths"]["/health"]["get"] and "security" not in doc["paths"]["/metrics"]["get"]


def openai_error_shape(ctx, response, case) -> None:
    """Every error is OpenAI's JSON, whether the document lists its status or not."""
    if response.status_code < 400:
        return
    try:
        body = response.json()
    except ValueError:
        raise AssertionError(f"the error is not JSON: {response.text[:200]!r}") from None
    assert isinstance(body, dict) and body.keys() == {"error"}, body
    error = body["error"]
    assert isinstance(error, dict) and error.keys() == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"] and isinstance(error["type"], str), error


def send_and_check(case, served) -> None:
    # without the key (schemathesis may make one up): refused before the body is read
    anonymous = case.call()
    if case.path.startswith("/v1/") or case.path in ("/tokenize", "/detokenize"):
        assert anonymous.status_code == 401, anonymous.text
    case.validate_response(anonymous, checks=CHECKS, additional_checks=[openai_error_shape])
    response = case.call(headers={"Authorization": f"Bearer {KEY}"})
    served.answers[case.path, response.status_code] += 1
    if response.status_code == 200 and response.headers["content-type"] == ["application/json"]:
        served.tokens += response.json().get("usage", {}).get("completion_tokens", 0)
    case.validate_response(response, checks=CHECKS, additional_checks=[openai_error_shape],
                           headers={"Authorization": f"Bearer {KEY}"})


# hypothesis over each operation's strategies, valid bodies and invalid ones, rather than
# schemathesis' pytest plugin: its fixture-loaded schemas rename pytest's nodes through a private
# attribute (Function._nodeid) that pytest 9.2 no longer has
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str)
def test_no_request_gets_a_server_error_and_every_error_is_openais(api, served, mode):
    operations = [result.ok() for result in api.get_all_operations()]
    assert len(operations) == 7
    for operation in operations:
        if mode == GenerationMode.NEGATIVE and not len(operation.body):
            continue  # a GET without parameters: nothing can be wrong in it
        @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy(generation_mode=mode))
        def fuzz(case):
            send_and_check(case, served)

        try:
            fuzz()
        except Exception as e:
            raise AssertionError(f"{operation.method.upper()} {operation.path} ({mode}): {e}") from e
    assert sum(served.answers.values()) >= len(operations) * 5  # not vacuous: requests were sent


def test_the_server_is_healthy_after_the_fuzzing_and_its_counts_add_up(served):
    end = time.time() + 30
    while (health := served.health())["busy"] or health["queued"]:
        assert time.time() < end, health  # a stream cut short stops at its next token
        time.sleep(0.05)
    answers = served.answers
    assert health["status"] == "ok" and not any(status >= 500 for _, status in answers)
    generated = sum(n for (path, status), n in answers.items() if path in GENERATING and status == 200)
    if answers:  # the fuzzing ran (not this test alone)
        assert generated, f"no generation got through: {answers}"
    counts = health["requests"]
    # each answered generation ran to its end, or stopped when the client left (the fuzzer reads
    # a stream's first events only); none failed, none found the queue full
    assert counts["done"] + counts["cancelled"] == generated and counts["failed"] == counts["rejected"] == 0
    # the whole answers' tokens, and the streams' (not counted here)
    assert health["tokens_generated"] >= served.tokens and (health["tokens_generated"] > 0) == (generated > 0)
