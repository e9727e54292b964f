"""Chat prompts for `Llama.create_chat_completion`, chosen as llama-cpp-python 0.3.36 chooses them.

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
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ._lib import LlamaError, ffi, lib

if TYPE_CHECKING:
    from .model import Model

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
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

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
                                 add_generation_prompt=True,
                                 strftime_now=lambda f: datetime.datetime.now().strftime(f), **extra)
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
