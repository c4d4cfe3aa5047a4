"""Tool calls in the Python API (engine/tools.py): the template's rendering of tools and of calls
sent back, parsing answers into calls (whole and streamed), and what is refused."""
import json

import jsonschema
import pytest

from nanocompile import Model
from nanocompile.engine.interpreted import InterpreterSession
from nanocompile.engine.tools import CallStream, check_tools, parse_calls
from nanocompile.errors import InputError
from nanocompile.results import ChatMessage

ADD = {"type": "function", "function": {"name": "add", "description": "a + b", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                     "b": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["a", "b"], "additionalProperties": False}}}


@pytest.fixture(scope="module")
def tiny(tiny_chat_model):
    session = InterpreterSession.from_weights(tiny_chat_model.config, tiny_chat_model.weights, n_ctx=256)
    return Model.from_session(tiny_chat_model, session, seed=0)


def test_parsing_answers_into_calls():
    tagged = 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    content, (call,) = parse_calls(tagged, {"add"})
    assert content == "Let me add." and call.name == "add" and json.loads(call.arguments) == {"a": 1, "b": 2}
    assert parse_calls('{"name": "add", "arguments": {"a": 1}}', {"add"})[1][0].name == "add"  # without the markers
    assert parse_calls('{"name": "mul", "arguments": {}}', {"add"}) == ('{"name": "mul", "arguments": {}}', [])
    broken = "<tool_call>\n{not json}\n</tool_call>"
    assert parse_calls(broken, {"add"}) == (broken, [])
    # streamed: text before a call flows, a tail that may open one waits, the call waits for the end
    stream = CallStream({"add"})
    assert stream.feed("Sure. <tool") == "Sure. " and stream.feed("_call>\n{") == "" and stream.feed('"x"') == ""
    held = CallStream({"add"})
    assert held.feed('{"name": "add", ') == "" and held.feed('"arguments": {"a": 1, "b": 2}}') == ""
    assert held.finish()[1][0].name == "add"


def test_the_template_renders_tools_and_calls_sent_back(real_model):
    """The real model's template (the tiny model's has no tools section)."""
    from nanocompile.api import _message_dicts
    from nanocompile.engine.tools import template_messages

    tok = real_model.tokenizer
    messages = [{"role": "user", "content": "1 + 2?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "3"}]
    text = tok.render_chat(template_messages(_message_dicts(messages)), tools=check_tools([ADD]))
    assert '<tools>\n{"type": "function", "function": {"name": "add"' in text
    assert '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>' in text  # not JSON in JSON
    assert "<tool_response>\n3\n</tool_response>" in text and text.endswith("<|im_start|>assistant\n")


def test_a_forced_call_parses_for_every_seed_and_goes_back_into_the_conversation(tiny):
    params = ADD["function"]["parameters"]
    for seed in range(8):
        out = tiny.create_chat_completion([{"role": "user", "content": "x"}], tools=[ADD], tool_choice="required",
                                          max_tokens=80, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=seed)
        assert out.finish_reason == "tool_calls" and out.message.content is None
        (call,) = out.message.tool_calls
        jsonschema.validate(json.loads(call.arguments), params)
    streamed = list(tiny.create_chat_completion([{"role": "user", "content": "x"}], tools=[ADD], tool_choice="required",
                                                max_tokens=80, temperature=0, stream=True))
    assert streamed[-1].stop_reason == "tool_calls" and streamed[-1].tool_calls[0].name == "add"
    assert not "".join(c.content for c in streamed)
    # the answer's message goes back as it came, with the tool's result
    again = [{"role": "user", "content": "x"}, ChatMessage("assistant", None, streamed[-1].tool_calls),
             {"role": "tool", "content": "5"}]
    assert tiny.create_chat_completion(again, tools=[ADD], max_tokens=3, temperature=0).usage.prompt_tokens > 10


@pytest.mark.parametrize("kwargs, message", [
    (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]),
     "tools.0.function.parameters: an object schema"),
    (dict(tools=[ADD, ADD]), "tools.1.function.name: 'add' is named twice"),
    (dict(tools=[]), "tools: a list of at least one function"),
    (dict(tools=[ADD], tool_choice={"type": "function", "function": {"name": "sub"}}),
     "tool_choice: no function named 'sub' in tools"),
    (dict(tool_choice="required"), "tool_choice: 'required' needs tools"),
    (dict(tools=[ADD], tool_choice="required", response_format={"type": "json_object"}),
     "constrains the answer to a call"),
])
def test_bad_tools_are_refused_naming_the_field(tiny, kwargs, message):
    with pytest.raises(InputError, match=message):
        tiny.create_chat_completion([{"role": "user", "content": "x"}], **kwargs)
