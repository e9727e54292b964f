"""`Llama.create_chat_completion`: chat prompts chosen as llama-cpp-python 0.3.36 chooses them, and the chat
completion (or tool call) it shapes from a completion.

- `chat_handler=` (a llama-cpp-python chat handler) is called as is.
- `chat_format=` names a format: "chatml" and "llama-2" render as llama-cpp-python's own formatters do
  (a system turn always present in chatml; llama-2's spacing); "chat_template.default" (or any
  "chat_template.<name>") is the model's own template; any other name is one of the library's built-in
  templates (`llama_chat_apply_template`: "llama3", "mistral-v7", ...).
- Without either: the model's `tokenizer.chat_template`, rendered with Jinja2 like llama-cpp-python
  (and `llama-server --jinja`), or "chatml" when it is exactly that template; a model without a
  template gets "llama-2", llama-cpp-python's fallback (llama-server's fallback is chatml instead).
"""
from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .._lib import LlamaError, ffi, lib
from .completion import RENDER_SPECIAL
from .grammar import JSON_GBNF, LlamaGrammar
from .llama_types import LogitsProcessorList, StoppingCriteriaList
from .tool_chat import family_for, required_grammar, tool_chunks, tool_reply

if TYPE_CHECKING:
    from ..model import Model

Chunk = dict[str, Any]

# the chatml template as llama-cpp-python recognizes it (a model carrying exactly it gets "chatml")
CHATML_TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
                   "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
                   "{% endif %}")


@dataclasses.dataclass
class ChatPrompt:
    """A rendered conversation: the prompt, extra stop strings and token ids, and whether the text already
    holds the BOS token (then it is tokenized without adding one)."""

    prompt: str
    stop: list[str]
    stop_token_ids: list[int] = dataclasses.field(default_factory=list)
    added_special: bool = False


Formatter = Callable[[Sequence[Mapping[str, Any]], Mapping[str, Any]], ChatPrompt]


def _text(m: Mapping[str, Any]) -> str | None:
    c = m.get("content")
    return c if isinstance(c, str) else None


def _system(messages: Sequence[Mapping[str, Any]]) -> str:
    return next(((m.get("content") or "") for m in messages if m.get("role") == "system"), "")


def format_chatml(messages: Sequence[Mapping[str, Any]], _: Mapping[str, Any]) -> ChatPrompt:
    """llama-cpp-python's "chatml": a system turn (empty when there is none), user and assistant turns,
    the assistant's turn opened; stop at <|im_end|>."""
    out = f"<|im_start|>system\n{_system(messages)}<|im_end|>\n"
    for m in messages:
        if m.get("role") in ("user", "assistant"):
            text = _text(m)
            out += f"<|im_start|>{m['role']}\n" + (f"{text}<|im_end|>\n" if text else "")
    return ChatPrompt(out + "<|im_start|>assistant\n", ["<|im_end|>"])


def format_llama2(messages: Sequence[Mapping[str, Any]], _: Mapping[str, Any]) -> ChatPrompt:
    """llama-cpp-python's "llama-2" (its fallback for a model without a template), spacing included."""
    system = _system(messages)
    if system:
        system = f"[INST] <<SYS>>\n{system}\n<</SYS>>"
    roles = {"user": "<s>[INST]", "assistant": "[/INST]"}
    turns = [(roles[m["role"]], _text(m)) for m in messages if m.get("role") in roles]
    out = system + " "
    for i, (role, text) in enumerate(turns):
        if system and i == 0:
            out += (text or "") + (" ", "</s>")[i % 2]
        elif text:
            out += role + text + " " + (" ", "</s>")[i % 2]
        else:
            out += role + " "
    return ChatPrompt(out + "[/INST]", [])


def jinja_formatter(template: str, bos: str, eos: str, eos_id: int) -> Formatter:
    """The model's own template rendered with Jinja2 (sandboxed, trim_blocks and lstrip_blocks, loop
    controls, `{% generation %}` ignored, `tojson` keeping non-ASCII), as llama-cpp-python renders it."""
    class _Generation(jinja2.ext.Extension):
        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    env = ImmutableSandboxedEnvironment(loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    compiled = env.from_string(template)

    def fail(message: str) -> None:
        raise ValueError(message)

    def render(messages: Sequence[Mapping[str, Any]], extra: Mapping[str, Any]) -> ChatPrompt:
        prompt = compiled.render(messages=messages, bos_token=bos, eos_token=eos, raise_exception=fail,
                                 strftime_now=lambda f: datetime.datetime.now().strftime(f),
                                 **({"add_generation_prompt": True} | dict(extra)))
        return ChatPrompt(prompt, [eos], [eos_id], added_special=True)

    return render


def builtin_formatter(name: str) -> Formatter:
    """One of the library's built-in templates, by name (`llama_chat_apply_template`)."""
    def render(messages: Sequence[Mapping[str, Any]], _: Mapping[str, Any]) -> ChatPrompt:
        return ChatPrompt(apply_chat_template(name, messages), [])
    return render


NAMED: dict[str, Formatter] = {"chatml": format_chatml, "llama-2": format_llama2}


def model_templates(model: Model) -> dict[str, str]:
    """The model's chat templates by llama-cpp-python's names: "chat_template.default" and
    "chat_template.<name>" for each named one."""
    out = {}
    for key in model.meta_keys():
        if key == "tokenizer.chat_template" or key.startswith("tokenizer.chat_template."):
            value = model.meta(key, limit=1 << 20)
            if value is not None:
                out["chat_template.default" if key == "tokenizer.chat_template" else key[len("tokenizer."):]] = value
    return out


def resolve_formatter(model: Model, chat_format: str | None) -> tuple[str, Formatter]:
    """(the format's name, its formatter) for `chat_format` (None: llama-cpp-python's choice)."""
    templates = model_templates(model)
    bos, eos = model.token_bos(), model.token_eos()
    text = lambda t: model.token_get_text(t) if t != -1 else ""  # noqa: E731

    def from_template(name: str) -> Formatter:
        return jinja_formatter(templates[name], text(bos), text(eos), eos)

    if chat_format is None:
        default = templates.get("chat_template.default")
        if default is None:
            return "llama-2", format_llama2
        if default == CHATML_TEMPLATE:
            return "chatml", format_chatml
        return "chat_template.default", from_template("chat_template.default")
    if chat_format in templates:
        return chat_format, from_template(chat_format)
    if chat_format in NAMED:
        return chat_format, NAMED[chat_format]
    return chat_format, builtin_formatter(chat_format)


def apply_chat_template(template: str, messages: Sequence[Mapping[str, Any]], *, add_assistant: bool = True) -> str:
    """The prompt for `messages` by the library's template support: a built-in name such as "chatml",
    "llama3" or "mistral-v7", or a template's text that the library recognizes."""
    keep: list[Any] = []
    chat = ffi.new("struct llama_chat_message[]", max(1, len(messages)))
    for i, m in enumerate(messages):
        content = m.get("content") or ""
        if isinstance(content, list):  # OpenAI content parts: the text ones
            content = "".join(p.get("text", "") for p in content if isinstance(p, Mapping) and p.get("type") == "text")
        if not isinstance(content, str):
            raise ValueError(f"messages[{i}]['content'] must be a string, got {type(content).__name__}")
        keep += [ffi.new("char[]", m["role"].encode()), ffi.new("char[]", content.encode())]
        chat[i].role, chat[i].content = keep[-2], keep[-1]
    tmpl = template.encode()
    L = lib()
    size = 1024 + 2 * sum(len(k) for k in keep)
    for _ in range(2):
        buf = ffi.new("char[]", size)
        n = L.llama_chat_apply_template(tmpl, chat, len(messages), add_assistant, buf, size)
        if n < 0:
            raise LlamaError(f"the chat format {template[:60]!r} is not one the library knows: pass chat_format= "
                             "'chatml', 'llama-2', 'chat_template.default' (the model's own) or a built-in name "
                             "such as 'llama3' or 'mistral-v7'")
        if n <= size:
            return ffi.unpack(buf, n).decode("utf-8", "replace")
        size = n + 1
    raise LlamaError("llama_chat_apply_template kept asking for a larger buffer")


def check_messages(messages: Any) -> None:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or "content" not in m:
            raise ValueError(f"messages[{i}] must be a dict with a string 'role' and a 'content', got {m!r}")


class ChatMixin:
    """`Llama`'s chat completions: the handler or the formatter chosen at construction renders the messages, the
    completion runs on them, and the result is shaped as a chat completion (or a tool call)."""

    chat_handler: Any
    _formatter: Any
    _model: Any

    if TYPE_CHECKING:  # Llama's own methods
        def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]: ...
        def create_completion(self, prompt: Any, **kw: Any) -> Any: ...

    def create_chat_completion(self, messages: list[dict[str, Any]], functions: list[dict[str, Any]] | None = None,
                               function_call: Any = None, tools: list[dict[str, Any]] | None = None,
                               tool_choice: Any = None, temperature: float = 0.2, top_p: float = 0.95, top_k: int = 40,
                               min_p: float = 0.05, typical_p: float = 1.0, stream: bool = False,
                               stop: str | list[str] | None = [], seed: int | None = None,  # noqa: B006
                               response_format: dict[str, Any] | None = None, max_tokens: int | None = None,
                               presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                               repeat_penalty: float = 1.0, tfs_z: float = 1.0, mirostat_mode: int = 0,
                               mirostat_tau: float = 5.0, mirostat_eta: float = 0.1, model: str | None = None,
                               logits_processor: LogitsProcessorList | None = None,
                               grammar: LlamaGrammar | None = None, logit_bias: dict[int, float] | None = None,
                               logprobs: bool | None = None, top_logprobs: int | None = None) -> Any:
        """An OpenAI `chat.completion` dict, or with stream=True an iterator of `chat.completion.chunk`s."""
        kw = dict(messages=messages, functions=functions, function_call=function_call, tools=tools,
                  tool_choice=tool_choice, temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
                  typical_p=typical_p, stream=stream, stop=stop, seed=seed, response_format=response_format,
                  max_tokens=max_tokens, presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                  repeat_penalty=repeat_penalty, tfs_z=tfs_z, mirostat_mode=mirostat_mode, mirostat_tau=mirostat_tau,
                  mirostat_eta=mirostat_eta, model=model, logits_processor=logits_processor, grammar=grammar,
                  logit_bias=logit_bias, logprobs=logprobs, top_logprobs=top_logprobs)
        if self.chat_handler is not None:
            return self.chat_handler(llama=self, **kw)
        check_messages(messages)
        return self._chat(**kw)

    def _chat(self, *, messages: Any, functions: Any, function_call: Any, tools: Any,
             tool_choice: Any, stream: bool, stop: Any, response_format: Any, grammar: Any, logprobs: Any,
             top_logprobs: Any, **kw: Any) -> Any:
        result = self._formatter(messages, {"functions": functions, "function_call": function_call, "tools": tools,
                                      "tool_choice": tool_choice})
        prompt = self.tokenize(result.prompt.encode("utf-8"), add_bos=not result.added_special, special=True)
        stop = ([] if stop is None else [stop] if isinstance(stop, str) else list(stop)) + result.stop
        criteria = None
        if result.stop_token_ids:
            ids = set(result.stop_token_ids)
            criteria = StoppingCriteriaList([lambda tokens, _: len(tokens) > 0 and int(tokens[-1]) in ids])
        grammar = _response_grammar(response_format) or grammar
        if functions is not None:
            tools = [{"type": "function", "function": f} for f in functions]
        if isinstance(function_call, str) and function_call in ("none", "auto"):
            tool_choice = function_call
        elif isinstance(function_call, Mapping) and "name" in function_call:
            tool_choice = {"type": "function", "function": {"name": function_call["name"]}}
        tool = None
        if isinstance(tool_choice, Mapping) and tools is not None:
            name = tool_choice["function"]["name"]
            tool = next((t for t in tools if t["function"]["name"] == name), None)
            if tool is None:
                raise ValueError(f"Tool choice '{name}' not found in tools.")
            try:
                grammar = LlamaGrammar.from_json_schema(json.dumps(tool["function"]["parameters"]))
            except (ValueError, KeyError):
                grammar = LlamaGrammar.from_string(JSON_GBNF)
        family = None  # tools and no named one: the reply is parsed for calls in the template's own syntax
        if tools and tool is None and tool_choice in (None, "auto", "required"):
            family = family_for(getattr(self, "chat_format", None), model_templates(self._model))
            if tool_choice == "required":
                grammar = required_grammar(family, tools)
        elif tool_choice not in (None, "none", "auto", "required") and not isinstance(tool_choice, Mapping):
            raise ValueError(f"tool_choice must be 'none', 'auto', 'required' or a named tool, got {tool_choice!r}")
        token = RENDER_SPECIAL.set(family is not None)  # the calls' markers are special tokens in most families
        try:
            out = self.create_completion(prompt=prompt, logprobs=top_logprobs if logprobs else None, stream=stream,
                                         stop=stop, stopping_criteria=criteria, grammar=grammar, **kw)
        finally:
            RENDER_SPECIAL.reset(token)
        if tool is not None:
            return _tool_call(tool["function"]["name"], out, stream)
        if family is not None:
            return (tool_chunks(family, tools, out, _chat_logprobs) if stream
                    else tool_reply(family, tools, out, _chat_logprobs))
        return _chat_chunks(out) if stream else _chat_whole(out)


def _chat_logprobs(lp: Mapping[str, Any] | None) -> Any:
    if lp is None:
        return None
    return {"content": [{"token": t, "bytes": None, "logprob": p,
                         "top_logprobs": [{"token": k, "logprob": v, "bytes": None} for k, v in (top or {}).items()]}
                        for t, p, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"])],
            "refusal": None}


def _response_grammar(response_format: Mapping[str, Any] | None) -> LlamaGrammar | None:
    if not response_format:
        return None
    kind = response_format.get("type")
    if kind == "json_object":
        schema = response_format.get("schema")
    elif kind == "json_schema":  # OpenAI's form; llama-cpp-python 0.3.36 ignores it, this package honours it
        schema = (response_format.get("json_schema") or {}).get("schema")
    else:
        return None
    return LlamaGrammar.from_string(JSON_GBNF) if schema is None else LlamaGrammar.from_json_schema(json.dumps(schema))


def _chat_whole(c: Chunk) -> Chunk:
    ch = c["choices"][0]
    return {"id": "chat" + c["id"], "object": "chat.completion", "created": c["created"], "model": c["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": ch["text"]},
                         "logprobs": _chat_logprobs(ch["logprobs"]), "finish_reason": ch["finish_reason"]}],
            "usage": c["usage"]}


def _chat_chunks(chunks: Iterator[Chunk]) -> Iterator[Chunk]:
    for i, c in enumerate(chunks):
        head = {"id": "chat" + c["id"], "model": c["model"], "created": c["created"], "object": "chat.completion.chunk"}
        if i == 0:
            yield head | {"choices": [{"index": 0, "delta": {"role": "assistant"}, "logprobs": None,
                                       "finish_reason": None}]}
        ch = c["choices"][0]
        yield head | {"choices": [{"index": 0, "delta": {"content": ch["text"]} if ch["finish_reason"] is None else {},
                                   "logprobs": _chat_logprobs(ch["logprobs"]), "finish_reason": ch["finish_reason"]}]}


def _tool_call(name: str, out: Any, stream: bool) -> Any:
    def call(cid: str, args: str, index: bool) -> dict[str, Any]:
        return ({"index": 0} if index else {}) | {"id": f"call__0_{name}_{cid}", "type": "function",
                                                   "function": {"name": name, "arguments": args}}
    if not stream:
        ch = out["choices"][0]
        return {"id": "chat" + out["id"], "object": "chat.completion", "created": out["created"], "model": out["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": None,
                                                     "function_call": {"name": name, "arguments": ch["text"]},
                                                     "tool_calls": [call(out["id"], ch["text"], False)]},
                             "logprobs": _chat_logprobs(ch["logprobs"]), "finish_reason": "tool_calls"}],
                "usage": out["usage"]}

    def chunks() -> Iterator[Chunk]:
        head: Chunk | None = None
        for c in out:
            if head is None:
                head = {"id": "chat" + c["id"], "object": "chat.completion.chunk", "created": c["created"],
                        "model": c["model"]}
                yield head | {"choices": [{"index": 0, "finish_reason": None, "logprobs": None, "delta": {
                    "role": "assistant", "content": None, "function_call": None, "tool_calls": None}}]}
            ch = c["choices"][0]
            yield head | {"choices": [{"index": 0, "finish_reason": None, "logprobs": _chat_logprobs(ch["logprobs"]),
                                       "delta": {"role": None, "content": None,
                                                 "function_call": {"name": name, "arguments": ch["text"]},
                                                 "tool_calls": [call(c["id"], ch["text"], True)]}}]}
        if head is not None:
            yield head | {"choices": [{"index": 0, "finish_reason": "tool_calls", "logprobs": None, "delta": {
                "role": None, "content": None, "function_call": None, "tool_calls": None}}]}
    return chunks()
