"""Tool calls as OpenAI defines them, carried by the model's own chat template: the tools are
rendered by the template (Qwen2.5's lists them in the system turn and asks for
`<tool_call>{"name": ..., "arguments": ...}</tool_call>`), the answer is parsed back into calls,
and where the request demands a call (tool_choice "required" or a named function) the answer is
constrained by a grammar (engine/constrain.py) to a call of an allowed function whose arguments
match its parameter schema, so that it always parses.

tool_choice: "auto" (the model decides), "none" (the tools are left out of the prompt), "required"
(a call of any of them), or {"type": "function", "function": {"name": ...}} (a call of that one).
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from ..errors import InputError
from ..results import ToolCall
from .constrain import JSON_OPTIONS, Grammar

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*" + re.escape(CLOSE), re.DOTALL)
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")  # OpenAI's rule for function names


def check_tools(tools) -> list[dict]:
    """The tools as the template takes them ({"type": "function", "function": {name, description,
    parameters}}), each checked; parameters default to an object with no properties."""
    if not isinstance(tools, list) or not tools:
        raise InputError("tools: a list of at least one function")
    out, names = [], set()
    for i, tool in enumerate(tools):
        where = f"tools.{i}"
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(
                tool.get("function"), dict):
            raise InputError(f"{where}: {{\"type\": \"function\", \"function\": {{\"name\", \"parameters\"}}}}")
        function = dict(tool["function"])
        name = function.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise InputError(f"{where}.function.name: 1 to 64 letters, digits, _, . or -, got {name!r}")
        if name in names:
            raise InputError(f"{where}.function.name: {name!r} is named twice")
        names.add(name)
        parameters = function.setdefault("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict) or parameters.get("type") != "object":
            raise InputError(f"{where}.function.parameters: an object schema ({{\"type\": \"object\", ...}}), got "
                             f"{json.dumps(parameters)[:80]}")
        Grammar.json_schema(parameters, f"{where}.function.parameters")  # compiles, or says why not
        out.append({"type": "function", "function": function})
    return out


def check_tool_choice(choice, tools: list[dict] | None) -> str | None:
    """"auto", "none", "required" or a function's name; None without tools."""
    if choice is None:
        return "auto" if tools else None
    names = [t["function"]["name"] for t in tools or []]
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise InputError(f"tool_choice: auto, none, required or {{\"type\": \"function\", \"function\": "
                             f"{{\"name\": ...}}}}, got {choice!r}")
        if choice != "none" and not tools:
            raise InputError(f"tool_choice: {choice!r} needs tools")
        return choice
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    if not isinstance(name, str):
        raise InputError(f"tool_choice: {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got {choice!r}")
    if name not in names:
        raise InputError(f"tool_choice: no function named {name!r} in tools ({', '.join(names) or 'none given'})")
    return name


@dataclass(frozen=True)
class ToolPlan:
    """What a chat request's tools make of its answer: the checked tools, the choice, the tools
    the prompt lists (none for "none"), the names whose calls are parsed back, and the grammar a
    forced call ("required" or named) is held to."""
    tools: list[dict] | None
    choice: str | None
    grammar: Grammar | None

    @property
    def listed(self) -> list[dict] | None:
        return self.tools if self.choice != "none" else None

    @property
    def names(self) -> list[str] | None:
        return [t["function"]["name"] for t in self.tools] if self.choice not in (None, "none") else None


def plan(tools, tool_choice, tokenizer) -> ToolPlan:
    """Checks a request's tools and tool_choice (naming the field at fault) and makes the grammar
    of a forced call."""
    checked = check_tools(tools) if tools is not None else None
    choice = check_tool_choice(tool_choice, checked)
    forced = choice not in (None, "auto", "none")
    return ToolPlan(checked, choice, call_grammar(checked, choice, tokenizer) if forced else None)


def call_grammar(tools: list[dict], choice: str, tokenizer) -> Grammar:
    """A single call, `<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`, of the named
    function or (required) of any: the template's own form, its markers as the tokens they are."""
    allowed = [t["function"] for t in tools if choice == "required" or t["function"]["name"] == choice]
    calls = [{"type": "object", "properties": {"name": {"const": f["name"]}, "arguments": f["parameters"]},
              "required": ["name", "arguments"], "additionalProperties": False} for f in allowed]
    schema = {**(calls[0] if len(calls) == 1 else {"anyOf": calls}), "x-guidance": JSON_OPTIONS}
    marks = [_marker(tokenizer, text) for text in (OPEN, CLOSE)]
    lark = f'start: {marks[0]} "\\n" call "\\n" {marks[1]}\ncall: %json {json.dumps(schema)}\n'
    return Grammar.lark(lark, "tools")


def _marker(tokenizer, text: str) -> str:
    ids = tokenizer.encode(text)
    return f"<[{ids[0]}]>" if len(ids) == 1 else json.dumps(text)  # a control token, or its text


def _as_call(text: str, names) -> ToolCall | None:
    try:
        call = json.loads(text)
    except ValueError:
        return None
    if not isinstance(call, dict) or call.get("name") not in names or not isinstance(call.get("arguments", {}),
                                                                                     (dict, str)):
        return None
    arguments = call.get("arguments", {})
    return ToolCall(f"call_{uuid.uuid4().hex[:24]}", call["name"],
                    arguments if isinstance(arguments, str) else json.dumps(arguments))


def parse_calls(text: str, names) -> tuple[str | None, list[ToolCall]]:
    """The text's tool calls of the functions named (`<tool_call>` blocks that parse as {"name",
    "arguments"}; or, as small models write it without the markers, an answer that is nothing
    but such an object) and the rest of it as content (None if nothing is left)."""
    calls = [c for c in (_as_call(m.group(1), names) for m in _CALL.finditer(text)) if c is not None]
    if calls:
        return _CALL.sub("", text).strip() or None, calls
    bare = _as_call(text.strip(), names)
    return (None, [bare]) if bare is not None else (text, [])


class CallStream:
    """Streamed text with tool calls held back: text before a `<tool_call>` is released as it
    comes (less a tail that may be the start of one); from the first call on, or from the start
    of an answer that begins as a JSON object, everything waits for the end, where finish()
    parses it."""

    def __init__(self, names):
        self.names = set(names)
        self.held = ""
        self.in_call = False
        self.released = False

    def feed(self, text: str) -> str:
        self.held += text
        if self.in_call:
            return ""
        if not self.released and self.held.lstrip()[:1] == "{":
            self.in_call = True
            return ""
        at = self.held.find(OPEN)
        if at >= 0:
            self.in_call = True
            out, self.held = self.held[:at], self.held[at:]
            return out
        keep = next((n for n in range(min(len(OPEN) - 1, len(self.held)), 0, -1)
                     if OPEN.startswith(self.held[-n:])), 0)
        out, self.held = self.held[:len(self.held) - keep], self.held[len(self.held) - keep:]
        self.released = self.released or bool(out.strip())
        return out

    def finish(self) -> tuple[str, list[ToolCall]]:
        """The rest of the text, and the calls it held."""
        content, calls = parse_calls(self.held, self.names)
        return content or "", calls


def template_messages(messages: list[dict]) -> list[dict]:
    """OpenAI's messages as the template reads them: an assistant's tool calls with their
    arguments as objects (OpenAI sends JSON text; the template writes them with tojson)."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                function = dict(c.get("function", c))
                if isinstance(function.get("arguments"), str):
                    try:
                        function["arguments"] = json.loads(function["arguments"])
                    except ValueError:
                        pass  # written as it came
                calls.append({"type": "function", "function": function})
            m = {**m, "tool_calls": calls}
        out.append(m)
    return out
