"""`create_chat_completion(tools=..., tool_choice="auto" | "required")`: the completion's text parsed into OpenAI
`tool_calls` (tool_calls.py reads each family's syntax), whole or streamed.

Streaming sends text as content until a tool-call start marker (or a marker's beginning) shows up, then holds
the rest; the end of the completion is parsed whole and the calls go out as `delta.tool_calls` chunks.
"""
from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from .grammar import LlamaGrammar, json_schema_to_gbnf
from .tool_calls import START_MARKERS, ParsedMessage, ToolCallError, detect_family, hold_from, openai_tool_calls, parse_tool_calls

Chunk = dict[str, Any]
LogprobsFn = Callable[[Any], Any]


def family_for(chat_format: str | None, templates: Mapping[str, str]) -> str:
    """The tool-call family of the chat format a `Llama` renders with (its template's markers)."""
    if chat_format in templates:
        return detect_family(templates[chat_format])
    if chat_format is None:
        return detect_family(templates.get("chat_template.default"))
    return "llama3" if chat_format.startswith("llama3") or chat_format == "llama4" else "generic"


def required_grammar(family: str, tools: Sequence[Mapping[str, Any]]) -> LlamaGrammar:
    """A grammar that makes the model call one of `tools` (tool_choice="required") in `family`'s JSON syntax."""
    key = {"hermes": "arguments", "generic": "arguments", "llama3": "parameters"}.get(family)
    if key is None:
        raise ValueError(f"tool_choice='required' is supported for the hermes (Qwen), llama3 and generic JSON "
                         f"tool-call families, not {family!r}: name the tool instead "
                         "(tool_choice={'type': 'function', 'function': {'name': ...}}) or use 'auto'")
    options = []
    for t in tools:
        fn = t.get("function", t)
        params = fn.get("parameters") or {"type": "object"}
        options.append({"type": "object", "properties": {"name": {"const": fn["name"]}, key: params},
                        "required": ["name", key]})
    gbnf = json_schema_to_gbnf({"anyOf": options} if len(options) > 1 else options[0])
    if family != "hermes":
        return LlamaGrammar.from_string(gbnf)
    gbnf = re.sub(r"^root ::=", "tool-call-json ::=", gbnf, flags=re.M)
    return LlamaGrammar.from_string(gbnf + '\nroot ::= "<tool_call>\\n" tool-call-json "\\n</tool_call>"')


def _parse(family: str, text: str, tools: Sequence[Mapping[str, Any]]) -> ParsedMessage:
    """The reply's calls; a call the model wrote wrong leaves the reply as plain text (with a warning)."""
    try:
        return parse_tool_calls(family, text, tools)
    except ToolCallError as e:
        warnings.warn(f"the model's tool call could not be read, the reply is returned as text: {e}",
                      RuntimeWarning, stacklevel=3)
        return ParsedMessage(text, [])


def _message(parsed: ParsedMessage, call_prefix: str) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if parsed.reasoning is not None:
        msg["reasoning_content"] = parsed.reasoning
    if parsed.tool_calls:
        msg["tool_calls"] = openai_tool_calls(parsed.tool_calls, call_prefix)
    return msg


def tool_reply(family: str, tools: Sequence[Mapping[str, Any]], out: Chunk, logprobs: LogprobsFn) -> Chunk:
    """The chat completion of a whole completion `out`: its text parsed for `family`'s tool calls."""
    ch = out["choices"][0]
    parsed = _parse(family, ch["text"], tools)
    if not parsed.tool_calls and parsed.reasoning is None and not _harmony(family, ch["text"]):
        parsed = ParsedMessage(ch["text"], [])  # plain text: as it came (gpt-oss: its final message's text)
    return {"id": "chat" + out["id"], "object": "chat.completion", "created": out["created"], "model": out["model"],
            "choices": [{"index": 0, "message": _message(parsed, "call_" + out["id"]),
                         "logprobs": logprobs(ch["logprobs"]),
                         "finish_reason": "tool_calls" if parsed.tool_calls else ch["finish_reason"]}],
            "usage": out["usage"]}


def tool_chunks(family: str, tools: Sequence[Mapping[str, Any]], chunks: Iterator[Chunk],
                logprobs: LogprobsFn) -> Iterator[Chunk]:
    """The chat chunks of a streamed completion: content while no call has begun, then the calls at the end."""
    head: Chunk = {}
    text, sent, held = "", 0, False

    def delta(d: dict[str, Any], finish: str | None = None, lp: Any = None) -> Chunk:
        return head | {"choices": [{"index": 0, "delta": d, "logprobs": lp, "finish_reason": finish}]}

    finish, cid = "stop", ""
    for c in chunks:
        if not head:
            head = {"id": "chat" + c["id"], "model": c["model"], "created": c["created"],
                    "object": "chat.completion.chunk"}
            cid = "call_" + c["id"]
            yield delta({"role": "assistant"})
        ch = c["choices"][0]
        if ch["finish_reason"] is not None:
            finish = ch["finish_reason"]
        text += ch["text"]
        if held or not ch["text"]:
            continue
        cut = hold_from(family, text[sent:])
        ready = len(text) if cut is None else sent + cut
        if ready > sent:
            yield delta({"content": text[sent:ready]}, lp=logprobs(ch["logprobs"]))
            sent = ready
        held = cut is not None and _started(family, text[sent:])
    if not head:
        return
    parsed = _parse(family, text, tools)
    if not parsed.tool_calls:
        if parsed.reasoning is not None and sent == 0:
            yield delta({"reasoning_content": parsed.reasoning})
            if parsed.content:
                yield delta({"content": parsed.content})
        elif _harmony(family, text):  # gpt-oss without a call: the final message's text, not the markup
            yield from _rest_of_content(parsed, text[:sent], delta)
        elif len(text) > sent:
            yield delta({"content": text[sent:]})
        yield delta({}, finish)
        return
    if parsed.reasoning is not None and sent == 0:
        yield delta({"reasoning_content": parsed.reasoning})
    yield from _rest_of_content(parsed, text[:sent], delta)
    for i, call in enumerate(openai_tool_calls(parsed.tool_calls, cid)):
        yield delta({"tool_calls": [{"index": i} | call]})
    yield delta({}, "tool_calls")


def _rest_of_content(parsed: ParsedMessage, sent: str, delta: Callable[[dict[str, Any]], Chunk]) -> Iterator[Chunk]:
    """The parsed content past what streaming already sent."""
    done = sent.lstrip()
    if parsed.content and parsed.content.startswith(done) and len(parsed.content) > len(done):
        yield delta({"content": parsed.content[len(done):]})


def _harmony(family: str, text: str) -> bool:
    """Whether `text` is gpt-oss's harmony markup (whose content is the final message's text, not the markup)."""
    return family == "gpt-oss" and "<|message|>" in text


def _started(family: str, rest: str) -> bool:
    """Whether the held text `rest` has really begun a call (not just a marker's first characters)."""
    if family in ("gpt-oss", "llama3", "generic"):
        return family == "gpt-oss" or rest.lstrip()[:1] in ("{", "[") or "<|python_tag|>" in rest
    return any(m in rest for m in START_MARKERS[family])

