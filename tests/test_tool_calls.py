"""tool_choice="auto" (and omitted, "none", "required") in `Llama.create_chat_completion`: a model's own tool-call
syntax parsed into OpenAI `tool_calls` (longhaul_cpp.llama.tool_calls), per family, with the published chat
templates of the vendored tree (vendor/llama.cpp/models/templates; LONGHAUL_TEMPLATES_DIR overrides).

Templates the pin lacks (Llama 4) are in tests/data/templates (its README names their sources).

- the family each published template gets (marker substrings, as upstream's common_chat_templates_apply);
- the template renders `tools` into the prompt, and an assistant turn with tool calls rendered by the template
  itself parses back to the same calls;
- scripted outputs per family: nested-JSON arguments, two calls, text + call, plain text; upstream's own
  expectations (tests/test-chat.cpp, re-typed); streaming in every split;
- side by side with llama-server: the same scripted text parsed by llama-server's common_chat_parse. The server
  cannot take a `grammar` with tools ("Cannot use custom grammar constraints with tools"), so the scripted text
  reaches its parser as an assistant prefill (the last message, continued: the server parses the generation
  prompt + prefill + what it generates), with the end-of-generation token forced by logit_bias;
- end to end: a synthetic model whose output a grammar forces, through create_chat_completion, whole and streamed.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT, upstream_bin_dir
from longhaul_cpp import Llama, SyntheticSpec, make_model, tool_path
from longhaul_cpp.llama.chat import jinja_formatter
from longhaul_cpp.llama.grammar import LlamaGrammar
from longhaul_cpp.llama.tool_calls import ToolCallError, detect_family, hold_from, parse_tool_calls
from longhaul_cpp.llama.tool_chat import tool_chunks, tool_reply

TEMPLATES = Path(os.environ.get("LONGHAUL_TEMPLATES_DIR") or ROOT / "vendor" / "llama.cpp" / "models" / "templates")
OWN_TEMPLATES = ROOT / "tests" / "data" / "templates"  # published templates the pin lacks
_IN_CI = os.environ.get("CI", "") not in ("", "0", "false")
pytestmark = pytest.mark.skipif(not TEMPLATES.is_dir() and not _IN_CI, reason=f"{TEMPLATES} is not there (vendor/llama.cpp is not "
                                "materialized: the build does it; or set LONGHAUL_TEMPLATES_DIR)")

# the families' published templates (GLM-4.5's own template is not in the tree: GLM-4.6 writes the same syntax)
FAMILY_OF = {
    "Qwen-Qwen3-0.6B": "hermes", "Qwen-Qwen2.5-7B-Instruct": "hermes", "openai-gpt-oss-120b": "gpt-oss",
    "GLM-4.6": "glm-4.5", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": "deepseek",
    "deepseek-ai-DeepSeek-V3.1": "deepseek", "moonshotai-Kimi-K2": "kimi-k2",
    "meta-llama-Llama-3.1-8B-Instruct": "llama3", "meta-llama-Llama-3.3-70B-Instruct": "llama3",
    "meta-llama-Llama-4-Scout-17B-16E-Instruct": "llama3",
    "MiniMax-M2": "minimax-m2", "microsoft-Phi-3.5-mini-instruct": "generic", "MiniMax-M3": "generic",
}
# the ends of a turn a model's text stops before (the end-of-generation tokens)
TURN_ENDS = ("<|im_end|>", "<|eot_id|>", "<|eot|>", "<|call|>", "<|return|>", "<｜end▁of▁sentence｜>", "[e~[", "<|user|>",
             "<|observation|>")

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city, today.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "opts": {"type": "object"}},
                          "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The local time of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
SPECIAL = {"type": "function", "function": {"name": "special_function", "description": "I'm special",
           "parameters": {"type": "object", "properties": {"arg1": {"type": "integer"}}, "required": ["arg1"]}}}
TOOLS = [WEATHER, TIME, SPECIAL]
NESTED = {"city": "Paris", "opts": {"units": ["c", {"deep": True, "n": 1.5}], "note": "a \"quoted\" <b>"}}


def template(name: str) -> str:
    own = OWN_TEMPLATES / f"{name}.jinja"
    return (own if own.is_file() else TEMPLATES / f"{name}.jinja").read_text()


def script(family: str, calls: list[tuple[str, dict[str, Any]]], content: str = "") -> str:
    """What a model of `family` writes for `content` and then `calls` (its own syntax, by hand)."""
    j = lambda a: json.dumps(a, ensure_ascii=False)  # noqa: E731
    xml = lambda a: {k: v if isinstance(v, str) else j(v) for k, v in a.items()}  # noqa: E731
    if family == "hermes":
        return content + "".join(f'<tool_call>\n{{"name": "{n}", "arguments": {j(a)}}}\n</tool_call>' for n, a in calls)
    if family == "gpt-oss":
        if not calls:  # a reply without a call: the final message
            return f"<|channel|>final<|message|>{content}" if content else ""
        # text before a call: a commentary preamble (llama-server reads no call after a final message)
        out = f"<|channel|>commentary<|message|>{content}<|end|><|start|>assistant" if content else ""
        return out + "<|start|>assistant".join(f"<|channel|>commentary to=functions.{n} <|constrain|>json<|message|>"
                                                f"{j(a)}<|call|>" for n, a in calls)
    if family == "glm-4.5":
        return content + "".join(f"<tool_call>{n}\n" + "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n"
                                                            for k, v in xml(a).items()) + "</tool_call>" for n, a in calls)
    if family == "deepseek-r1":
        body = "\n".join(f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{n}\n```json\n{j(a)}\n```<｜tool▁call▁end｜>"
                         for n, a in calls)
        return content + (f"<｜tool▁calls▁begin｜>{body}<｜tool▁calls▁end｜>" if calls else "")
    if family == "deepseek":
        body = "".join(f"<｜tool▁call▁begin｜>{n}<｜tool▁sep｜>{j(a)}<｜tool▁call▁end｜>" for n, a in calls)
        return content + (f"<｜tool▁calls▁begin｜>{body}<｜tool▁calls▁end｜>" if calls else "")
    if family == "kimi-k2":
        body = "".join(f"<|tool_call_begin|>functions.{n}:{i}<|tool_call_argument_begin|>{j(a)}<|tool_call_end|>"
                       for i, (n, a) in enumerate(calls))
        return content + (f"<|tool_calls_section_begin|>{body}<|tool_calls_section_end|>" if calls else "")
    if family == "llama3":  # text before a call: the python tag opens the call
        return content + ("<|python_tag|>" if content and calls else "") + "; ".join(f'{{"name": "{n}", "parameters": {j(a)}}}' for n, a in calls)
    if family == "llama4":  # the python block (the text), then the calls one after another, as its template writes
        head = f"<|python_start|>{content}<|python_end|>" if calls else content
        return head + "".join(f'{{"name": "{n}", "parameters": {j(a)}}}' for n, a in calls)
    if family == "minimax-m2":
        body = "".join(f'<invoke name="{n}">\n' + "".join(f'<parameter name="{k}">{v}</parameter>\n'
                                                          for k, v in xml(a).items()) + "</invoke>\n" for n, a in calls)
        return content + (f"<minimax:tool_call>\n{body}</minimax:tool_call>" if calls else "")
    raise AssertionError(family)


SCRIPT_FAMILIES = ["hermes", "gpt-oss", "glm-4.5", "deepseek-r1", "deepseek", "kimi-k2", "llama3", "llama4",
                   "minimax-m2"]
CASES = {
    "nested": ("", [("get_weather", NESTED)]),
    "two-calls": ("", [("get_weather", {"city": "Oslo"}), ("get_time", {"city": "Lima"})]),
    "text-and-call": ("Let me look that up.", [("get_time", {"city": "Rome"})]),
    "plain-text": ("It is sunny: no tool needed.\n{not a call}", []),
}


def parser_family(family: str) -> str:
    return {"deepseek-r1": "deepseek", "llama4": "llama3"}.get(family, family)


def calls_of(msg: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg.get("tool_calls") or []]


@pytest.mark.parametrize("name", sorted(FAMILY_OF))
def test_family_from_the_template(name: str) -> None:
    assert detect_family(template(name)) == FAMILY_OF[name]


def _render(name: str, messages: list[dict[str, Any]], gen: bool, **extra: Any) -> str:
    src = template(name)
    bos = {"deepseek": "<｜begin▁of▁sentence｜>", "llama3": "<|begin_of_text|>"}.get(FAMILY_OF[name], "")
    return jinja_formatter(src, bos, "", 0)(messages, {"tools": TOOLS, "add_generation_prompt": gen, **extra}).prompt


@pytest.mark.parametrize("name", [n for n, f in FAMILY_OF.items() if f != "generic"])
def test_template_renders_tools_and_its_own_calls_parse_back(name: str) -> None:
    """The template puts the tools in the prompt; the assistant turn it writes for two calls (its own syntax)
    parses back to those calls."""
    user = [{"role": "user", "content": "Weather and time in Paris?"}]
    prompt = _render(name, user, True)
    if "tools" in template(name):  # (the DeepSeek R1 / V3.1 templates do not describe tools)
        assert "get_weather" in prompt and "special_function" in prompt and "Weather in a city" in prompt
    calls = [("get_weather", NESTED), ("get_time", {"city": "Paris"})]
    turn = {"role": "assistant", "content": "", "tool_calls": [
        {"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": a}}
        for i, (n, a) in enumerate(calls)]}
    if FAMILY_OF[name] == "gpt-oss" or name.startswith("meta-llama-Llama-3"):  # one call per turn
        calls, turn["tool_calls"] = calls[:1], turn["tool_calls"][:1]
    whole = _render(name, user + [turn], False)
    start = next(i for i, (a, b) in enumerate(zip(prompt + "\0", whole)) if a != b)
    if whole[start - 1] not in ">\n":  # not inside a marker the two share the start of
        start = max(whole.rfind(">", 0, start), whole.rfind("\n", 0, start)) + 1
    text = whole[start:].rstrip()
    for end in TURN_ENDS:
        text = text.split(end)[0] if end in text and FAMILY_OF[name] != "gpt-oss" else text.removesuffix(end)
    got = parse_tool_calls(FAMILY_OF[name], text, TOOLS)
    assert [(c.name, json.loads(c.arguments)) for c in got.tool_calls] == calls, text
    assert got.content is None, text


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("family", SCRIPT_FAMILIES)
def test_scripted_outputs(family: str, case: str) -> None:
    content, calls = CASES[case]
    text = script(family, calls, content)
    got = parse_tool_calls(parser_family(family), text, TOOLS)
    assert [(c.name, json.loads(c.arguments)) for c in got.tool_calls] == calls
    assert (got.content or "") == content.strip() if calls or family == "gpt-oss" else got.content == text


# upstream's expectations for the same texts (tests/test-chat.cpp at the pin, re-typed): text, content, calls
UPSTREAM = [
    ("hermes", '<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}</tool_call>', None,
     [("special_function", {"arg1": 1})]),
    ("hermes", "Hello, world!\nWhat's up?<tool_call>\n{\"name\": \"special_function\", \"arguments\": {\"arg1\": 1}}"
     "</tool_call>", "Hello, world!\nWhat's up?", [("special_function", {"arg1": 1})]),
    ("glm-4.5", "<tool_call>special_function\n<arg_key>arg1</arg_key>\n<arg_value>1</arg_value>\n</tool_call>", None,
     [("special_function", {"arg1": 1})]),
    ("deepseek", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\"city\": \"XYZCITY\"}"
     "<｜tool▁call▁end｜><｜tool▁calls▁end｜>", None, [("get_time", {"city": "XYZCITY"})]),
    ("deepseek", "REASONING</think>CONTENT<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\"city\": "
     "\"Paris\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜>"
     "<｜tool▁calls▁end｜>", "CONTENT", [("get_time", {"city": "Paris"}), ("get_weather", {"city": "Paris"})]),
    ("kimi-k2", "<|tool_calls_section_begin|><|tool_call_begin|>functions.special_function:0"
     "<|tool_call_argument_begin|>{\"arg1\": 1}<|tool_call_end|><|tool_calls_section_end|>", None,
     [("special_function", {"arg1": 1})]),
    ("minimax-m2", "\n</think>\n\n<minimax:tool_call>\n<invoke name=\"special_function\">\n<parameter name=\"arg1\">1"
     "</parameter>\n</invoke>\n</minimax:tool_call>", None, [("special_function", {"arg1": 1})]),
    ("gpt-oss", " to=functions.special_function<|channel|>analysis<|message|>{\"arg1\": 1}", None,
     [("special_function", {"arg1": 1})]),
    ("gpt-oss", "<|channel|>analysis to=functions.special_function<|message|>{\"arg1\": 1}", None,
     [("special_function", {"arg1": 1})]),
    ("gpt-oss", " to=functions.special_function<|channel|>analysis <|constrain|>json<|message|>{\"arg1\": 1}", None,
     [("special_function", {"arg1": 1})]),
    ("gpt-oss", "<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant to=functions.special_function"
     "<|channel|>analysis<|message|>{\"arg1\": 1}", None, [("special_function", {"arg1": 1})]),
    ("gpt-oss", "<|channel|>final<|message|>Hello, world!\nWhat's up?", "Hello, world!\nWhat's up?", []),
    ("gpt-oss", "<|channel|>commentary<|message|>Hello, world!\nWhat's up?", "Hello, world!\nWhat's up?", []),
    ("llama3", "Hello, world!\nWhat's up?", "Hello, world!\nWhat's up?", []),
]


@pytest.mark.parametrize("family, text, content, calls", UPSTREAM)
def test_upstream_expectations(family: str, text: str, content: str | None, calls: list[Any]) -> None:
    got = parse_tool_calls(family, text, [SPECIAL, TIME, WEATHER])
    assert [(c.name, json.loads(c.arguments)) for c in got.tool_calls] == calls
    assert got.content == content
    if family == "kimi-k2":  # upstream keeps Kimi's own id
        assert got.tool_calls[0].id == "functions.special_function:0"


def test_typed_xml_arguments_and_errors() -> None:
    """XML-style values: text for a string parameter, JSON otherwise; a broken call says what is wrong."""
    got = parse_tool_calls("glm-4.5", script("glm-4.5", [("get_weather", {"city": "123", "opts": {"a": 1}})]), TOOLS)
    assert json.loads(got.tool_calls[0].arguments) == {"city": "123", "opts": {"a": 1}}
    with pytest.raises(ToolCallError, match="not valid JSON"):
        parse_tool_calls("hermes", '<tool_call>{"name": "f", "arguments": {</tool_call>')
    with pytest.raises(ToolCallError, match="must be a JSON object"):
        parse_tool_calls("kimi-k2", "<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>[1]<|tool_call_end|>")
    with pytest.warns(RuntimeWarning, match="could not be read"):  # in a reply: plain text, not an exception
        bad = tool_reply("hermes", TOOLS, _whole('<tool_call>{"name": "f"</tool_call>'), lambda _: None)
    assert bad["choices"][0]["message"]["content"] == '<tool_call>{"name": "f"</tool_call>'
    with pytest.raises(ValueError, match="unknown tool-call family"):
        parse_tool_calls("nope", "x")


def _completion_chunks(text: str, cuts: list[int]) -> list[dict[str, Any]]:
    head = {"id": "cmpl-x", "object": "text_completion", "created": 1, "model": "m"}
    bounds = [0, *cuts, len(text)]
    out = [head | {"choices": [{"text": text[a:b], "index": 0, "logprobs": None, "finish_reason": None}]}
           for a, b in zip(bounds, bounds[1:])]
    return out + [head | {"choices": [{"text": "", "index": 0, "logprobs": None, "finish_reason": "stop"}]}]


def _whole(text: str) -> dict[str, Any]:
    return {"id": "cmpl-x", "object": "text_completion", "created": 1, "model": "m", "usage": {},
            "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": "stop"}]}


def _collect(chunks: list[dict[str, Any]]) -> tuple[str | None, list[tuple[str, Any]], str | None, list[str]]:
    content, calls, finish, pieces = None, [], None, []
    for c in chunks:
        ch = c["choices"][0]
        d = ch["delta"]
        if d.get("content") is not None:
            content = (content or "") + d["content"]
            pieces.append(d["content"])
        for tc in d.get("tool_calls") or []:
            assert tc["index"] == len(calls) and tc["type"] == "function" and tc["id"]
            calls.append((tc["function"]["name"], json.loads(tc["function"]["arguments"])))
        finish = ch["finish_reason"] or finish
    return content, calls, finish, pieces


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("family", SCRIPT_FAMILIES)
def test_streaming_equals_whole(family: str, case: str) -> None:
    """Streamed in one-character chunks and in three pieces: the same calls, content and finish as the whole
    reply; text goes out before a call starts, never a tool-call marker."""
    content, calls = CASES[case]
    text = script(family, calls, content)
    fam = parser_family(family)
    whole = tool_reply(fam, TOOLS, _whole(text), lambda _: None)["choices"][0]
    assert calls_of(whole["message"]) == calls
    assert whole["finish_reason"] == ("tool_calls" if calls else "stop")
    for cuts in (list(range(1, len(text))), [len(text) // 3, 2 * len(text) // 3]):
        chunks = list(tool_chunks(fam, TOOLS, iter(_completion_chunks(text, cuts)), lambda _: None))
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
        got, got_calls, finish, pieces = _collect(chunks)
        assert got_calls == calls and finish == whole["finish_reason"]
        assert (got or "").strip() == (whole["message"]["content"] or "").strip()
        assert not any(m in p for p in pieces for m in ("<tool_call>", "<|tool_call", "<｜tool", "<minimax", '"name"'))
    if family in ("hermes", "deepseek", "kimi-k2", "minimax-m2", "glm-4.5") and content and calls:
        assert hold_from(fam, text[:len(content) + 3]) == len(content)  # text first, then held at the marker


# --- a synthetic model: the end-to-end path and llama-server side by side ------------------------------------

SPEC = SyntheticSpec(arch="qwen3moe", n_expert=8, n_expert_used=2, expert_type="q8_0")


def _model_with(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """The synthetic model (byte-level vocabulary: any text is writable) carrying `name`'s template."""
    import longhaul_cpp.models.writer as writer
    path = tmp_path_factory.mktemp("tc") / f"{name}.gguf"
    keep = writer.CHATML_TEMPLATE
    writer.CHATML_TEMPLATE = template(name)
    try:
        return make_model(dataclasses.replace(SPEC), path)[0]
    finally:
        writer.CHATML_TEMPLATE = keep


def _gbnf_literal(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


# template -> the syntax its model writes (script's family)
E2E = {"Qwen-Qwen3-0.6B": "hermes", "moonshotai-Kimi-K2": "kimi-k2", "MiniMax-M2": "minimax-m2",
       "deepseek-ai-DeepSeek-V3.1": "deepseek", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": "deepseek-r1",
       "GLM-4.6": "glm-4.5", "meta-llama-Llama-3.1-8B-Instruct": "llama3", "openai-gpt-oss-120b": "gpt-oss",
       "meta-llama-Llama-4-Scout-17B-16E-Instruct": "llama4"}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {name: _model_with(tmp_path_factory, name) for name in E2E}


@pytest.mark.parametrize("name", sorted(E2E))
def test_end_to_end_forced_output(models: dict[str, Path], name: str) -> None:
    """create_chat_completion(tools=..., tool_choice="auto") on a model whose output a grammar forces: the calls,
    whole and streamed; omitted tool_choice is "auto"; "none" leaves the text as it came."""
    family = E2E[name]
    calls = [("get_weather", NESTED), ("get_time", {"city": "Lima"})]
    if family == "llama3":
        calls = calls[:1]
    text = script(family, calls, "" if family == "llama3" else "Checking.")
    grammar = f"root ::= {_gbnf_literal(text)}"
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    with Llama(models[name], n_ctx=4096, n_threads=2, verbose=False) as llm:
        kw = dict(messages=msgs, tools=TOOLS, max_tokens=len(text.encode()) + 8, temperature=0)
        r = llm.create_chat_completion(tool_choice="auto", grammar=LlamaGrammar.from_string(grammar), **kw)
        ch = r["choices"][0]
        assert ch["finish_reason"] == "tool_calls" and calls_of(ch["message"]) == calls
        assert ch["message"]["content"] == (None if family == "llama3" else "Checking.")
        assert len({c["id"] for c in ch["message"]["tool_calls"]}) == len(calls)
        s = list(llm.create_chat_completion(stream=True, grammar=LlamaGrammar.from_string(grammar), **kw))
        content, got, finish, _ = _collect(s)
        assert got == calls and finish == "tool_calls" and (content or "").strip() == (ch["message"]["content"] or "")
        plain = llm.create_chat_completion(tool_choice="none", grammar=LlamaGrammar.from_string(grammar), **kw)
        assert plain["choices"][0]["message"]["content"] == text and "tool_calls" not in plain["choices"][0]["message"]


def test_required_forces_a_call_and_bad_choices(models: dict[str, Path]) -> None:
    """tool_choice="required" (a JSON family): whatever the model samples, the reply is a call to one of the tools;
    an unknown tool_choice, or "required" for a family without a grammar here, is refused before generating."""
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    with Llama(models["Qwen-Qwen3-0.6B"], n_ctx=4096, n_threads=2, verbose=False) as llm:
        cities = ["Paris", "Lima", "Oslo"]
        tool = {"type": "function", "function": TIME["function"] | {"parameters": {
            "type": "object", "properties": {"city": {"enum": cities}}, "required": ["city"]}}}
        for seed in (3, 4):
            r = llm.create_chat_completion(msgs, tools=[tool], tool_choice="required", max_tokens=200,
                                           temperature=0.8, seed=seed)
            ch = r["choices"][0]
            assert ch["finish_reason"] == "tool_calls" and [n for n, _ in calls_of(ch["message"])] == ["get_time"]
            assert calls_of(ch["message"])[0][1]["city"] in cities
        with pytest.raises(ValueError, match="tool_choice must be"):
            llm.create_chat_completion(msgs, tools=[TIME], tool_choice="sometimes")
    with Llama(models["moonshotai-Kimi-K2"], n_ctx=4096, n_threads=2, verbose=False) as llm:
        with pytest.raises(ValueError, match="tool_choice='required' is supported for"):
            llm.create_chat_completion(msgs, tools=[TIME], tool_choice="required")


def _server_exe() -> Path | None:
    """The package's llama-server, else the build's (LONGHAUL_UPSTREAM_BIN)."""
    try:
        return tool_path("llama-server")
    except FileNotFoundError:
        d = upstream_bin_dir()
        return d / "llama-server" if d is not None and (d / "llama-server").exists() else None


@contextlib.contextmanager
def _server(model: Path) -> Iterator[str]:
    exe = _server_exe()
    assert exe is not None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([str(exe), "-m", str(model), "--jinja", "--host", "127.0.0.1", "--port", str(port),
                             "-c", "4096", "-np", "1", "-t", "2", "--n-gpu-layers", "0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"llama-server exited: {proc.stderr.read().decode(errors='replace')[-3000:]}")
            try:
                with urllib.request.urlopen(base + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            assert time.time() < deadline, "llama-server did not become healthy in 120 s"
            time.sleep(0.2)
        yield base
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _server_message(base: str, text: str) -> dict[str, Any]:
    body = {"messages": [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": text}],
            "tools": TOOLS, "tool_choice": "auto", "parallel_tool_calls": True, "max_tokens": 4, "temperature": 0, "logit_bias": {"2": 100}}
    req = urllib.request.Request(base + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return json.loads(resp.read())["choices"][0]["message"]
    except urllib.error.HTTPError as e:
        raise AssertionError(f"llama-server: {e.code} {e.read().decode(errors='replace')}") from None


# where the pin's llama-server refuses a scripted text (HTTP 500 "The model produced output that does not match
# the expected peg-native format") that we read: two calls in one MiniMax-M2 or Llama 4 reply (also as the
# templates themselves write them) or in one Llama 3.x reply (';'-separated JSON), and Llama 3.x plain text holding
# a '{'
SERVER_REFUSES = {("MiniMax-M2", "two-calls"), ("meta-llama-Llama-3.1-8B-Instruct", "two-calls"),
                  ("meta-llama-Llama-3.1-8B-Instruct", "plain-text"),
                  ("meta-llama-Llama-4-Scout-17B-16E-Instruct", "two-calls")}
# where it reads no call and keeps the whole text as content: Llama 4's text inside the python block before a call
# (its template writes a call's content there; the pin's parser reads calls only after an empty block), and a bare
# JSON call as the template's instructions ask for one (ours reads both as calls)
SERVER_KEEPS_TEXT = {("meta-llama-Llama-4-Scout-17B-16E-Instruct", "text-and-call"),
                     ("meta-llama-Llama-4-Scout-17B-16E-Instruct", "bare-json")}


@pytest.mark.skipif(_server_exe() is None, reason="no llama-server (the package's, or LONGHAUL_UPSTREAM_BIN's)")
# gpt-oss is not compared here: with a prefill the pin's server continues inside a "final" channel message, so the
# harmony markup of a prefill comes back as content (its parser never sees it as a header); it is compared by
# test_side_by_side_with_the_servers_parse (the text as a generated reply) and against upstream's
# tests/test-chat.cpp expectations (UPSTREAM)
@pytest.mark.parametrize("name", sorted(set(E2E) - {"openai-gpt-oss-120b"}))
def test_side_by_side_with_llama_server(models: dict[str, Path], name: str) -> None:
    """Each scripted text parsed by llama-server (--jinja, the same template) and by us: the same calls and
    content. The text goes in as the assistant's prefill (the server parses prefill + generation), the model then
    ends at once (its end-of-generation token biased up). Where the server refuses the text (SERVER_REFUSES) it
    must still refuse it, and ours reads it as expected."""
    family = E2E[name]
    cases = sorted(CASES.items()) + ([("bare-json", ("", [("get_time", {"city": "Rome"})]))]
                                     if family == "llama4" else [])
    with _server(models[name]) as base:
        for case, (content, calls) in cases:
            text = script(family, calls, content)
            if case == "bare-json":
                text = text.removeprefix("<|python_start|><|python_end|>")
            ours = tool_reply(parser_family(family), TOOLS, _whole(text), lambda _: None)["choices"][0]["message"]
            assert calls_of(ours) == calls, (case, text)
            if (name, case) in SERVER_KEEPS_TEXT:
                theirs = _server_message(base, text)
                assert not calls_of(theirs) and theirs.get("content") == text, (case, theirs)
                continue
            if (name, case) in SERVER_REFUSES:
                with pytest.raises(AssertionError, match="does not match the expected"):
                    _server_message(base, text)
                continue
            theirs = _server_message(base, text)
            assert calls_of(theirs) == calls, (case, text, theirs)
            # (the server keeps Llama 3.x's python tag, a special token of the real vocabulary, in the content)
            assert ((theirs.get("content") or "").replace("<|python_tag|>", "").strip()
                    == (ours.get("content") or "").strip()), (case, theirs)


def _parse_exe() -> Path | None:
    """tests/test-longhaul-chat-parse.cpp (in the series), built with upstream's tests (LONGHAUL_UPSTREAM_BIN)."""
    d = upstream_bin_dir()
    return d / "test-longhaul-chat-parse" if d is not None and (d / "test-longhaul-chat-parse").exists() else None


def _servers_parse(exe: Path, model: Path, text: str, tmp: Path) -> dict[str, Any]:
    """llama-server's parse of `text` as the reply the model generates to a tool request (no prefill): the
    server's own request handling and parser, called without the server (test-longhaul-chat-parse)."""
    req = {"messages": [{"role": "user", "content": "Weather?"}], "tools": TOOLS, "tool_choice": "auto",
           "parallel_tool_calls": True}
    (tmp / "request.json").write_text(json.dumps(req))
    (tmp / "reply.txt").write_bytes(text.encode())
    r = subprocess.run([str(exe), str(model), str(tmp / "request.json"), str(tmp / "reply.txt")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


# where the server's parse of a generated reply differs from ours, as in SERVER_REFUSES and SERVER_KEEPS_TEXT
PARSE_REFUSES = SERVER_REFUSES
PARSE_KEEPS_TEXT = SERVER_KEEPS_TEXT
# and where it reads only the first of two calls: gpt-oss calls one function per turn (its template writes one), the
# server's parser stops after the first <|call|>; ours reads both
PARSE_FIRST_CALL_ONLY = {("openai-gpt-oss-120b", "two-calls")}


def _think_opens(name: str) -> bool:
    """Whether the template's generation prompt, rendered as llama-server renders it by default (`enable_thinking`
    true, which the pinned server passes to every template), leaves a think block open: then the reply the model
    generates begins inside it and closes it. Read from what the generation prompt adds to the rendered chat, so a
    template that opens one is covered as it is, without a list of names."""
    user = [{"role": "user", "content": "Weather?"}]
    chat, gen = _render(name, user, False, enable_thinking=True), _render(name, user, True, enable_thinking=True)
    added = gen[len(chat):] if gen.startswith(chat) else gen
    return added.rfind("<think>") > added.rfind("</think>")


def test_think_block_read_from_the_template() -> None:
    """The test below starts a reply inside a think block where the template's generation prompt opened one: some
    of the published templates do, some do not (so the reading is not stuck at one answer)."""
    opens = {n for n in E2E if _think_opens(n)}
    assert opens and opens != set(E2E), opens


@pytest.mark.skipif(_parse_exe() is None, reason="no test-longhaul-chat-parse (built with LONGHAUL_UPSTREAM_TESTS)")
@pytest.mark.parametrize("name", sorted(E2E))
def test_side_by_side_with_the_servers_parse(models: dict[str, Path], name: str, tmp_path: Path) -> None:
    """Each scripted text as the reply a model generates, parsed by llama-server's own code (its request handling,
    the template's format and parser, its reasoning format: test-longhaul-chat-parse) and by us: the same calls
    and content. gpt-oss included: its reply cannot go through a server's prefill (test above)."""
    exe = _parse_exe()
    assert exe is not None
    family = E2E[name]
    think_opens = _think_opens(name)
    cases = sorted(CASES.items()) + ([("bare-json", ("", [("get_time", {"city": "Rome"})]))]
                                     if family == "llama4" else [])
    for case, (content, calls) in cases:
        text = script(family, calls, content)
        if case == "bare-json":
            text = text.removeprefix("<|python_start|><|python_end|>")
        if think_opens:
            text = "I think.</think>" + text
        ours = tool_reply(parser_family(family), TOOLS, _whole(text), lambda _: None)["choices"][0]["message"]
        assert calls_of(ours) == calls, (case, text)
        theirs = _servers_parse(exe, models[name], text, tmp_path)
        if (name, case) in PARSE_REFUSES:
            assert "does not match the expected" in theirs.get("error", ""), (case, theirs)
            continue
        assert "error" not in theirs, (case, text, theirs)
        if think_opens:
            assert (theirs.get("reasoning_content") or "").strip() == ours.get("reasoning_content") == "I think.", \
                (case, theirs)
        if (name, case) in PARSE_FIRST_CALL_ONLY:
            assert calls_of(theirs) == calls[:1] and len(calls_of(ours)) > 1, (case, theirs)
            continue
        if (name, case) in PARSE_KEEPS_TEXT:
            assert not calls_of(theirs) and theirs.get("content") == text, (case, theirs)
            continue
        assert calls_of(theirs) == calls, (case, text, theirs)
        assert ((theirs.get("content") or "").replace("<|python_tag|>", "").strip()
                == (ours.get("content") or "").strip()), (case, theirs)
    if family == "gpt-oss":  # a call after a final message: the server drops it (the final message ends the turn)
        text = ("<|channel|>final<|message|>Checking.<|end|><|start|>assistant<|channel|>commentary to=functions.get_time"
                ' <|constrain|>json<|message|>{"city": "Lima"}<|call|>')
        ours = tool_reply(parser_family(family), TOOLS, _whole(text), lambda _: None)["choices"][0]["message"]
        theirs = _servers_parse(exe, models[name], text, tmp_path)
        assert calls_of(ours) == [("get_time", {"city": "Lima"})] and ours["content"] == "Checking.", ours
        assert not calls_of(theirs) and theirs.get("content") == "Checking.", theirs


def test_markers_that_are_special_tokens_reach_the_parser(models: dict[str, Path]) -> None:
    """In the published vocabularies the call markers of Kimi K2, gpt-oss and DeepSeek are control tokens, whose
    pieces render only with special=True: a chat that parses tool calls renders its completion with them, a plain
    one without. Simulated on the byte vocabulary: detokenize drops the markers unless special is set."""
    import re

    name = "moonshotai-Kimi-K2"
    calls = [("get_time", {"city": "Lima"})]
    text = script(E2E[name], calls, "Checking.")
    markers = sorted(set(re.findall(r"<\|[a-z_]+\|>", text)))
    assert markers
    grammar = f"root ::= {_gbnf_literal(text)}"
    msgs = [{"role": "user", "content": "Time in Lima?"}]
    with Llama(models[name], n_ctx=4096, n_threads=2, verbose=False) as llm:
        real = llm.detokenize

        def detokenize(tokens: Any, prev_tokens: Any = None, special: bool = False) -> bytes:
            out = real(tokens, prev_tokens=prev_tokens, special=special)
            for m in markers if not special else []:
                out = out.replace(m.encode(), b"")
            return out

        llm.detokenize = detokenize  # type: ignore[method-assign]
        kw = dict(messages=msgs, tools=TOOLS, max_tokens=len(text.encode()) + 8, temperature=0)
        r = llm.create_chat_completion(tool_choice="auto", grammar=LlamaGrammar.from_string(grammar), **kw)
        assert calls_of(r["choices"][0]["message"]) == calls
        plain = llm.create_chat_completion(tool_choice="none", grammar=LlamaGrammar.from_string(grammar), **kw)
        hidden = text
        for m in markers:
            hidden = hidden.replace(m, "")
        assert plain["choices"][0]["message"]["content"] == hidden
