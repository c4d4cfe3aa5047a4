"""Constrained decoding (engine/constrain.py, llguidance): what a grammar refuses when it is made,
and that sampled output always matches it. The tiny random model's tokens are bytes and its
logits noise, so at temperature 1 it tries every corner of a schema; the real model's outputs are
what users get, at temperature 0 and 1."""
import json

import jsonschema
import numpy as np
import pytest

from nanocompile import Grammar, Model
from nanocompile.engine import constrain
from nanocompile.engine.interpreted import InterpreterSession
from nanocompile.errors import InputError

SCHEMAS = {
    "person": {"type": "object", "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "email": {"type": "string", "maxLength": 20}},
        "required": ["name", "age"], "additionalProperties": False},
    "nested": {"type": "object", "properties": {
        "point": {"type": "object", "properties": {"x": {"type": "number", "minimum": -10, "maximum": 10},
                                                   "y": {"type": "number", "minimum": -10, "maximum": 10}},
                  "required": ["x", "y"], "additionalProperties": False},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3}},
        "required": ["point", "tags"], "additionalProperties": False},
    "enums": {"type": "object", "properties": {
        "color": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"},
        "sizes": {"type": "array", "items": {"enum": [1, 2, 3]}, "minItems": 1, "maxItems": 4}},
        "required": ["color", "ok", "sizes"], "additionalProperties": False},
    "optional": {"type": "object", "properties": {
        "id": {"type": "integer", "minimum": 1, "maximum": 9999},
        "note": {"anyOf": [{"type": "string", "maxLength": 8}, {"type": "null"}]}},
        "required": ["id"], "additionalProperties": False},
}


@pytest.fixture(scope="module")
def tiny_model(tiny_chat_model):
    session = InterpreterSession.from_weights(tiny_chat_model.config, tiny_chat_model.weights, n_ctx=256)
    return Model.from_session(tiny_chat_model, session, seed=0)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_sampled_noise_always_matches_the_schema(tiny_model, name):
    """Twelve seeds at temperature 1 on the random model: every answer parses and validates."""
    grammar = Grammar.json_schema(SCHEMAS[name])
    for seed in range(12):
        out = tiny_model.create_completion("x", grammar=grammar, max_tokens=200, temperature=1.0, top_k=0,
                                           top_p=1.0, min_p=0.0, seed=seed)
        assert out.finish_reason == "stop", (seed, out.text)
        jsonschema.validate(json.loads(out.text), SCHEMAS[name])


def test_other_grammars_and_their_masks(tiny_model):
    regex = Grammar.regex(r"[a-c]{3}-[0-9]{2}")
    gbnf = Grammar.gbnf('root ::= "yes" | "no" | "maybe " [0-9]')
    for seed in range(6):
        sampled = dict(max_tokens=40, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=seed)
        text = tiny_model.create_completion("x", grammar=regex, **sampled).text
        assert len(text) == 6 and set(text[:3]) <= set("abc") and text[3] == "-" and text[4:].isdigit()
        assert tiny_model.create_completion("x", grammar=gbnf, **sampled).text in {"yes", "no"} | {
            f"maybe {d}" for d in range(10)}
    # the log-probabilities are those of the masked row: what the sampler chose from
    out = tiny_model.create_completion("x", grammar=regex, logprobs=5, max_tokens=10, temperature=0)
    assert all(np.isfinite(lp.logprob) for lp in out.logprobs)
    assert len(out.logprobs[0].top) == 3 and {t for t, _ in out.logprobs[0].top} == {
        tiny_model.tokenize(c)[0] for c in "abc"}  # only a, b or c can start it
    chat = tiny_model.create_chat_completion([{"role": "user", "content": "hi"}], max_tokens=60, temperature=1.0,
                                             seed=3, response_format={"type": "json_object"})
    assert isinstance(json.loads(chat.message.content), dict) and chat.timings.mask_seconds > 0


@pytest.mark.parametrize("make, message", [
    (lambda: Grammar.json_schema({"type": "objectx"}), "json_schema: Invalid type: objectx"),
    (lambda: Grammar.json_schema("{not json"), "json_schema: not JSON"),
    (lambda: Grammar.json_schema([1]), "json_schema: a JSON schema is an object"),
    (lambda: Grammar.json_schema({"type": "string", "pattern": "(("}), "unclosed group"),
    (lambda: Grammar.json_schema({"type": "object", "properties": {"a": {"type": "integer", "minimum": 5,
                                                                          "maximum": 2}}, "required": ["a"]}),
     "unsatisfiable"),
    (lambda: Grammar.gbnf("root ::= ("), "grammar: the GBNF grammar does not parse"),
    (lambda: Grammar.gbnf('start ::= "a"'), "No 'root' rule"),
    (lambda: Grammar.gbnf(""), "grammar: a grammar is text that is not empty"),
    (lambda: Grammar.regex("("), "regex: "),
    (lambda: constrain.from_request(json_schema={"type": "object"}, grammar='root ::= "a"'),
     "json_schema and grammar: give one of them, not both"),
    (lambda: constrain.from_request(response_format={"type": "xml"}), "response_format.type: one of text"),
    (lambda: constrain.from_request(response_format={"type": "json_schema"}), "response_format.json_schema: an object"),
    (lambda: constrain.from_request(format="yaml"), 'format: "json" or a JSON schema'),
])
def test_a_grammar_that_cannot_be_compiled_is_refused_naming_the_field(make, message):
    with pytest.raises(InputError, match=message):
        make()


def test_the_request_fields_map_to_grammars():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    assert constrain.from_request() is None and constrain.from_request(response_format={"type": "text"}) is None
    for got in (constrain.from_request(json_schema=schema), constrain.from_request(format=schema),
                constrain.from_request(response_format={"type": "json_schema", "json_schema": {"name": "a",
                                                                                             "schema": schema}}),
                constrain.from_request(response_format={"type": "json_object", "schema": schema})):
        assert got.kind == "json_schema" and got.source == schema
    assert constrain.from_request(format="json").source == {"type": "object"}
    assert constrain.from_request(grammar='root ::= "a"').kind == "gbnf"


def test_the_api_refuses_a_grammar_it_is_not_given_as_one(tiny_model):
    with pytest.raises(InputError, match="grammar must be a Grammar"):
        tiny_model.create_completion("x", grammar='root ::= "a"')
    with pytest.raises(InputError, match="response_format and grammar: give one"):
        tiny_model.create_chat_completion([{"role": "user", "content": "x"}], response_format={"type": "json_object"},
                                          grammar=Grammar.regex("a"))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_real_models_answers_match_their_schemas(real_model, real_compiled, temperature):
    model = Model.from_session(real_model, real_compiled)
    for i, (name, schema) in enumerate(sorted(SCHEMAS.items())):
        out = model.create_chat_completion([{"role": "user", "content": f"Give an example {name} as JSON."}],
                                           response_format={"type": "json_schema",
                                                            "json_schema": {"name": name, "schema": schema}},
                                           max_tokens=120, temperature=temperature, seed=i)
        assert out.finish_reason == "stop", out.message.content
        jsonschema.validate(json.loads(out.message.content), schema)
        steps = max(len(out.tokens) - 1, 1)
        print(f"{name} at {temperature}: {out.message.content} (masks {out.timings.mask_seconds / steps * 1e3:.3f} "
              f"ms a token, decode {out.timings.decode_seconds / steps * 1e3:.1f} ms a token)")


def test_prompt_lookup_under_a_grammar_gives_the_same_tokens(real_model, real_compiled):
    """Drafts are masked row by row, as each token is consumed: the same tokens as without."""
    model = Model.from_session(real_model, real_compiled)
    code = "def area(w, h):\n    return w * h\n"
    prompt = f"Return this code as JSON with the key code:\n{code}"
    grammar = Grammar.json_schema({"type": "object", "properties": {"code": {"type": "string", "maxLength": 80}},
                                   "required": ["code"], "additionalProperties": False})
    messages = [{"role": "user", "content": prompt}]
    plain = model.create_chat_completion(messages, grammar=grammar, max_tokens=60, temperature=0, lookup=False)
    drafted = model.create_chat_completion(messages, grammar=grammar, max_tokens=60, temperature=0, lookup=True)
    assert drafted.tokens == plain.tokens and drafted.timings.drafted_tokens > 0
    json.loads(plain.message.content)
