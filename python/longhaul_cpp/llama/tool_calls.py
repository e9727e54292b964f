"""Tool calls in a chat model's own syntax, parsed into OpenAI `tool_calls`.

The family is picked from the chat template's source by marker substrings, in the spirit of upstream
llama.cpp's `common_chat_templates_apply` (whose specialised formats are chosen by `src.find(...)`):

- "gpt-oss" (harmony): `<|channel|>`; a call is `... to=functions.NAME ... <|message|>{json}<|call|>`
- "kimi-k2": `<|tool_calls_section_begin|>`; `<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{json}<|tool_call_end|>`
- "minimax-m2": `<minimax:tool_call>`; `<invoke name="NAME"><parameter name="K">V</parameter></invoke>`
- "glm-4.5": `<arg_key>`; `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>`
- "deepseek": `tool▁calls▁begin`; R1/V3 `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{json}\\n```<｜tool▁call▁end｜>`,
  V3.1 `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{json}<｜tool▁call▁end｜>`
- "hermes" (Qwen2.5, Qwen3, Hermes): `<tool_call>`; `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (and the
  Qwen3-Coder body `<function=NAME><parameter=K>V</parameter></function>`)
- "llama3" (Llama 3.x, Llama 4): `<|python_tag|>` / header tokens; a reply that is a JSON `{"name", "parameters"}`
  (Llama 3.x: several separated by ';'; Llama 4's template writes its calls one after another, after its
  `<|python_start|>TEXT<|python_end|>`, whose TEXT is the turn's content)
- "generic": any other template; a reply that is JSON `{"name", "arguments"|"parameters"}`, a list of those, or
  `{"tool_call": ...}` / `{"tool_calls": [...]}`.
"""
from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

FAMILIES = ("gpt-oss", "kimi-k2", "minimax-m2", "glm-4.5", "deepseek", "hermes", "llama3", "generic")

# (family, every substring the template must hold), first match wins
_DETECT: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("generic", ("]<]minimax[>[",)),  # MiniMax-M3: its own namespace syntax, not read here
    ("gpt-oss", ("<|channel|>",)),
    ("kimi-k2", ("<|tool_calls_section_begin|>",)),
    ("minimax-m2", ("<minimax:tool_call>",)),
    ("glm-4.5", ("<tool_call>", "<arg_key>")),
    ("deepseek", ("tool▁calls▁begin",)),
    ("hermes", ("<tool_call>",)),
    ("llama3", ("<|python_tag|>",)),
    ("llama3", ("<|header_start|>",)),
    ("llama3", ("<|start_header_id|>",)),
)

# where a call starts in the model's text (streaming holds text back from the first of these)
START_MARKERS: dict[str, tuple[str, ...]] = {
    "gpt-oss": (" to=", "<|start|>", "<|channel|>"),
    "kimi-k2": ("<|tool_calls_section_begin|>", "<|tool_call_begin|>"),
    "minimax-m2": ("<minimax:tool_call>",),
    "glm-4.5": ("<tool_call>",),
    "deepseek": ("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>"),
    "hermes": ("<tool_call>",),
    "llama3": ("<|python_tag|>", "<|python_start|>"),
    "generic": (),
}


class ToolCallError(ValueError):
    """The model's text holds a tool call that cannot be read."""


@dataclasses.dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object's text
    id: str | None = None  # an id the model wrote itself (Kimi K2's "functions.NAME:IDX")


@dataclasses.dataclass
class ParsedMessage:
    content: str | None
    tool_calls: list[ToolCall]
    reasoning: str | None = None


def detect_family(template: str | None) -> str:
    """The tool-call family of a chat template's source ("generic" when none of the markers is there)."""
    src = template or ""
    return next((fam for fam, marks in _DETECT if all(m in src for m in marks)), "generic")


def _args_json(value: Any, where: str) -> str:
    if isinstance(value, str):  # arguments given as a JSON string
        try:
            value = json.loads(value, strict=False)
        except json.JSONDecodeError as e:
            raise ToolCallError(f"{where}: the arguments are not JSON: {value[:80]!r} ({e})") from None
    if not isinstance(value, Mapping):
        raise ToolCallError(f"{where}: the arguments must be a JSON object, got {json.dumps(value)[:80]}")
    return json.dumps(value, ensure_ascii=False)


def _load(text: str, where: str) -> Any:
    try:
        return json.loads(text, strict=False)
    except json.JSONDecodeError as e:
        raise ToolCallError(f"{where}: not valid JSON: {text[:80]!r} ({e})") from None


def _param_types(tools: Sequence[Mapping[str, Any]] | None, name: str) -> dict[str, Any]:
    for t in tools or []:
        fn = t.get("function", t)
        if fn.get("name") == name:
            return dict(((fn.get("parameters") or {}).get("properties") or {}))
    return {}


def _typed_value(raw: str, schema: Any) -> Any:
    """An XML-style argument's value: the raw text for a string parameter, else JSON when it reads as JSON."""
    kind = schema.get("type") if isinstance(schema, Mapping) else None
    if kind == "string" or (isinstance(kind, list) and "string" in kind and len(kind) == 1):
        return raw
    try:
        return json.loads(raw.strip())
    except json.JSONDecodeError:
        return raw


def _xml_args(pairs: Sequence[tuple[str, str]], tools: Any, name: str) -> str:
    types = _param_types(tools, name)
    return json.dumps({k: _typed_value(v, types.get(k)) for k, v in pairs}, ensure_ascii=False)


def _content(parts: Sequence[str]) -> str | None:
    text = "".join(parts).strip()
    return text or None


def _blocks(text: str, start: str, end: str) -> tuple[list[str], list[str]]:
    """(the text outside, the bodies inside) of the `start`...`end` blocks; a last block may lack its end."""
    outside, inside, pos = [], [], 0
    while True:
        i = text.find(start, pos)
        if i < 0:
            outside.append(text[pos:])
            return outside, inside
        outside.append(text[pos:i])
        j = text.find(end, i + len(start))
        inside.append(text[i + len(start):j if j >= 0 else len(text)])
        if j < 0:
            return outside, inside
        pos = j + len(end)


def _parse_hermes(text: str, tools: Any) -> ParsedMessage:
    outside, bodies = _blocks(text, "<tool_call>", "</tool_call>")
    calls = []
    for body in bodies:
        fn = re.match(r"\s*<function=([^>\n]+)>(.*?)(?:</function>|$)", body, re.S)
        if fn:  # Qwen3-Coder's XML body
            pairs = re.findall(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", fn.group(2), re.S)
            calls.append(ToolCall(fn.group(1).strip(), _xml_args(pairs, tools, fn.group(1).strip())))
            continue
        obj = _load(body.strip(), "<tool_call>")
        if not isinstance(obj, Mapping) or not isinstance(obj.get("name"), str):
            raise ToolCallError(f"<tool_call>: expected {{\"name\": ..., \"arguments\": ...}}, got {body.strip()[:80]!r}")
        calls.append(ToolCall(obj["name"], _args_json(obj.get("arguments", obj.get("parameters", {})), obj["name"])))
    return ParsedMessage(_content(outside), calls)


def _parse_glm(text: str, tools: Any) -> ParsedMessage:
    outside, bodies = _blocks(text, "<tool_call>", "</tool_call>")
    calls = []
    for body in bodies:
        name = body.split("<arg_key>", 1)[0].strip()
        if not name:
            raise ToolCallError(f"<tool_call>: no function name before the arguments in {body[:80]!r}")
        pairs = re.findall(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", body, re.S)
        calls.append(ToolCall(name, _xml_args([(k.strip(), v) for k, v in pairs], tools, name)))
    return ParsedMessage(_content(outside), calls)


def _parse_minimax(text: str, tools: Any) -> ParsedMessage:
    outside, bodies = _blocks(text, "<minimax:tool_call>", "</minimax:tool_call>")
    calls = []
    for body in bodies:
        for name, inner in re.findall(r'<invoke name="([^"]+)">(.*?)(?:</invoke>|$)', body, re.S):
            pairs = re.findall(r'<parameter name="([^"]+)">(.*?)</parameter>', inner, re.S)
            calls.append(ToolCall(name, _xml_args(pairs, tools, name)))
    return ParsedMessage(_content(outside), calls)


def _sectioned(text: str, section: str, call: str) -> str:
    """`text` with its calls' section opened before the first call when the model left the opening out."""
    i = text.find(call)
    return text[:i] + section + text[i:] if i >= 0 and section not in text[:i] else text


def _parse_deepseek(text: str, _: Any) -> ParsedMessage:
    text = _sectioned(text, "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>")
    outside, sections = _blocks(text, "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>")
    calls = []
    for section in sections:
        for body in _blocks(section, "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>")[1]:
            head, sep, rest = body.partition("<｜tool▁sep｜>")
            if not sep:
                raise ToolCallError(f"DeepSeek tool call without <｜tool▁sep｜>: {body[:80]!r}")
            if head.strip() == "function":  # R1 / V3: name, then a ```json block
                m = re.match(r"\s*([^\n]+)\n```(?:json)?\n(.*?)\n?```\s*$", rest, re.S)
                if not m:
                    raise ToolCallError(f"DeepSeek tool call: expected NAME\\n```json\\n{{...}}\\n```, got {rest[:80]!r}")
                name, args = m.group(1).strip(), m.group(2)
            else:  # V3.1: the name before the separator, the JSON after it
                name, args = head.strip(), rest
            calls.append(ToolCall(name, _args_json(args.strip(), name)))
    return ParsedMessage(_content(outside), calls)


def _parse_kimi(text: str, _: Any) -> ParsedMessage:
    text = _sectioned(text, "<|tool_calls_section_begin|>", "<|tool_call_begin|>")
    outside, sections = _blocks(text, "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>")
    calls = []
    for section in sections:
        for body in _blocks(section, "<|tool_call_begin|>", "<|tool_call_end|>")[1]:
            cid, sep, args = body.partition("<|tool_call_argument_begin|>")
            if not sep:
                raise ToolCallError(f"Kimi tool call without <|tool_call_argument_begin|>: {body[:80]!r}")
            cid = cid.strip()
            name = cid.split(":", 1)[0] if ":" in cid else cid
            name = name[len("functions."):] if name.startswith("functions.") else name
            calls.append(ToolCall(name, _args_json(args.strip(), name), cid))
    return ParsedMessage(_content(outside), calls)


_HARMONY_MSG = re.compile(r"(?:<\|start\|>assistant)?([^<]*?)(?:<\|channel\|>([^<]*?))?(?:\s*<\|constrain\|>[^<]*)?"
                          r"<\|message\|>(.*?)(?=<\|end\|>|<\|call\|>|<\|return\|>|<\|start\|>|$)", re.S)


def _parse_gpt_oss(text: str, _: Any) -> ParsedMessage:
    content, reasoning, calls = [], [], []
    for role_head, channel_head, body in _HARMONY_MSG.findall(text):
        head = f"{role_head} {channel_head or ''}"
        to = re.search(r"to=functions\.([^\s<]+)", head)
        channel = (channel_head or "").split(" to=")[0].split()[0] if (channel_head or "").strip() else ""
        if to:
            calls.append(ToolCall(to.group(1), _args_json(body.strip(), to.group(1))))
        elif channel == "analysis":
            reasoning.append(body)
        else:
            content.append(body)
    if not (content or reasoning or calls):  # no harmony markup at all: the text is the content
        return ParsedMessage(_content([text]), [])
    return ParsedMessage(_content(content), calls, _content(reasoning))


def _json_calls(obj: Any) -> list[ToolCall] | None:
    """The calls a generic JSON reply holds, None when it is not one."""
    if isinstance(obj, list):
        got = [_json_calls(o) for o in obj]
        return None if not obj or any(g is None for g in got) else [c for g in got for c in g or []]
    if not isinstance(obj, Mapping):
        return None
    if "tool_calls" in obj and isinstance(obj["tool_calls"], list):
        return _json_calls(obj["tool_calls"])
    if "tool_call" in obj:
        return _json_calls(obj["tool_call"])
    fn = obj.get("function") if isinstance(obj.get("function"), Mapping) else obj
    if isinstance(fn.get("name"), str) and ("arguments" in fn or "parameters" in fn):
        return [ToolCall(fn["name"], _args_json(fn.get("arguments", fn.get("parameters")), fn["name"]))]
    return None


def _json_sequence(body: str) -> list[ToolCall] | None:
    """Calls written as JSON values one after another (separated by nothing, blanks or ';'), None when the body
    is not only that."""
    dec, i, out = json.JSONDecoder(strict=False), 0, []
    while i < len(body):
        try:
            value, i = dec.raw_decode(body, i)
        except json.JSONDecodeError:
            return None
        got = _json_calls(value)
        if got is None:
            return None
        out += got
        while i < len(body) and (body[i].isspace() or body[i] == ";"):
            i += 1
    return out


def _parse_json(text: str, _: Any) -> ParsedMessage:
    body = text.strip()
    prefix = ""
    if "<|python_tag|>" in body:
        prefix, _, body = body.partition("<|python_tag|>")
        body = body.strip()
    elif "<|python_start|>" in body:  # Llama 4: <|python_start|>TEXT<|python_end|> then the calls
        prefix, _, body = body.partition("<|python_start|>")
        inner, end, rest = body.partition("<|python_end|>")
        if end and rest.strip():
            prefix, body = prefix + inner, rest.strip()
        else:  # the calls inside the block
            body = inner.strip()
    calls: list[ToolCall] | None = None
    if body[:1] in ("{", "["):
        try:
            calls = _json_calls(json.loads(body))
        except json.JSONDecodeError:
            calls = _json_sequence(body)
    if isinstance(calls, list) and not calls:
        calls = None
    if calls is None:
        if isinstance(json_obj := _try_load(body), Mapping) and isinstance(json_obj.get("response"), str):
            return ParsedMessage(json_obj["response"], [])
        return ParsedMessage(_content([text]), [])
    return ParsedMessage(_content([prefix]), calls)


def _try_load(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


_PARSERS = {"gpt-oss": _parse_gpt_oss, "kimi-k2": _parse_kimi, "minimax-m2": _parse_minimax, "glm-4.5": _parse_glm,
            "deepseek": _parse_deepseek, "hermes": _parse_hermes, "llama3": _parse_json, "generic": _parse_json}


def parse_tool_calls(family: str, text: str, tools: Sequence[Mapping[str, Any]] | None = None) -> ParsedMessage:
    """The content and tool calls of a model's reply `text` in `family`'s syntax (`tools`, OpenAI's list, types
    the XML-style arguments: a string parameter stays text, others are read as JSON)."""
    if family not in _PARSERS:
        raise ValueError(f"unknown tool-call family {family!r}; known: {', '.join(FAMILIES)}")
    reasoning = None
    if family != "gpt-oss" and "</think>" in text:  # a thinking model's reasoning, before its reply
        head, _, text = text.partition("</think>")
        reasoning = _content([head.replace("<think>", "", 1)])
    out = _PARSERS[family](text, tools)
    out.reasoning = out.reasoning or reasoning
    return out


def hold_from(family: str, text: str) -> int | None:
    """Where streaming must stop sending `text` as content: the first tool-call start marker, a marker's
    beginning at the very end, or (JSON families) a reply that opens with '{' or '['; None: all can go."""
    if family == "gpt-oss":  # harmony markup all through: held to the end
        return 0
    if family in ("llama3", "generic") and text.lstrip()[:1] in ("", "{", "["):
        return 0
    hits = [i for m in START_MARKERS[family] if (i := text.find(m)) >= 0]
    for m in START_MARKERS[family]:
        hits += [len(text) - k for k in range(min(len(m) - 1, len(text)), 0, -1) if text.endswith(m[:k])]
    return min(hits) if hits else None


def openai_tool_calls(calls: Sequence[ToolCall], prefix: str) -> list[dict[str, Any]]:
    """OpenAI `tool_calls` entries; ids are the model's own when it wrote one, else `prefix`_INDEX."""
    return [{"id": c.id or f"{prefix}_{i}", "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}} for i, c in enumerate(calls)]
