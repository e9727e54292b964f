"""`LlamaGrammar`: a GBNF grammar for the library's grammar sampler, from text, a file or a JSON schema.

The JSON-schema conversion accepts the language llama-cpp-python 0.3.36's converter accepts, so a
constrained greedy answer is the same: a space is at most one " " after a token, object properties come in
the schema's order (required ones always, optional ones in order or left out), `additionalProperties` is
off unless given, enum / const values are their JSON text. Supported: type (or a list of types), properties,
required, additionalProperties, items (a schema or a tuple list), prefixItems, minItems, maxItems, minLength,
maxLength, enum, const, anyOf, oneOf, and local $ref (#/definitions/..., #/$defs/...). Anything else
(patterns, formats, allOf, remote refs) raises ValueError naming the keyword: pass a GBNF grammar instead.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

# JSON: any object, whitespace as JSON allows (at most 20 spaces or tabs after a newline)
JSON_GBNF = r"""
root ::= obj
val ::= obj | arr | str | num | ("true" | "false" | "null") ws
obj ::= "{" ws ( str ":" ws val ( "," ws str ":" ws val )* )? "}" ws
arr ::= "[" ws ( val ( "," ws val )* )? "]" ws
str ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" ( ["\\bfnrt] | "u" [0-9a-fA-F]{4} ) )* "\"" ws
num ::= ( "-"? ( [0-9] | [1-9] [0-9]{0,15} ) ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9] [1-9]{0,15} )? ws
ws ::= | " " | "\n" [ \t]{0,20}
"""


class LlamaGrammar:
    """A grammar as llama-cpp-python's `LlamaGrammar`: `from_string`, `from_file`, `from_json_schema`."""

    def __init__(self, *, _grammar: str) -> None:
        self._grammar = _grammar
        self._root = "root"

    @classmethod
    def from_string(cls, grammar: str, verbose: bool = True) -> LlamaGrammar:
        return cls(_grammar=grammar)

    @classmethod
    def from_file(cls, file: str | Path, verbose: bool = True) -> LlamaGrammar:
        try:
            text = Path(file).read_text()
        except OSError as e:
            raise ValueError(f"cannot read the grammar file {file}: {e.strerror}") from None
        if not text.strip():
            raise ValueError(f"the grammar file {file} is empty")
        return cls.from_string(text, verbose=verbose)

    @classmethod
    def from_json_schema(cls, json_schema: str, verbose: bool = True) -> LlamaGrammar:
        return cls.from_string(json_schema_to_gbnf(json_schema), verbose=verbose)


_DIGITS15 = "[0-9]{0,15}"
_BASICS = {
    "space": '" "?',
    "boolean": '( "true" | "false" ) space',
    "null": '"null" space',
    "integral-part": f"[0-9] | [1-9] {_DIGITS15}",
    "decimal-part": f"[0-9] {_DIGITS15}",
    "number": '( "-"? integral-part ) ( "." decimal-part )? ( [eE] [-+]? integral-part )? space',
    "integer": '( "-"? integral-part ) space',
    "char": r'[^"\\] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} )',
    "string": r'"\"" char* "\"" space',
    "value": "object | array | string | number | boolean | null",
    "object": '"{" space ( string ":" space value ( "," space string ":" space value )* )? "}" space',
    "array": '"[" space ( value ( "," space value )* )? "]" space',
}
_NEEDS = {"number": ["integral-part", "decimal-part"], "integer": ["integral-part"], "string": ["char"],
          "value": ["object", "array", "string", "number", "boolean", "null"],
          "object": ["string", "value"], "array": ["value"], "decimal-part": [], "integral-part": []}
_KNOWN = {"type", "properties", "required", "additionalProperties", "items", "prefixItems", "minItems", "maxItems",
          "minLength", "maxLength", "enum", "const", "anyOf", "oneOf", "$ref", "definitions", "$defs", "title",
          "description", "default", "examples", "$schema", "$id", "$comment"}


def _literal(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r") + '"'


def _repeat(item: str, lo: int, hi: int | None, sep: str | None = None) -> str:
    """`item` lo to hi times (no upper bound when hi is None), separated by `sep`."""
    if sep is None and (lo, hi) == (0, 1):
        return f"{item}?"
    joined = f" {sep} " if sep else " "
    head = joined.join([item] * lo)
    nxt = f"{sep} {item}" if sep else item
    if hi is None:
        if lo == 0:
            return f"( {item} ( {nxt} )* )?" if sep else f"{item}*"
        return f"{head} ( {nxt} )*"
    extra = hi - lo
    if extra <= 0:
        return head
    first = nxt if lo > 0 else item
    tail = "".join(f" ( {nxt}" for _ in range(extra - 1)) + " )?" * (extra - 1)
    return (f"{head} " if head else "") + f"( {first}{tail} )?"


class _Converter:
    def __init__(self, schema: Any) -> None:
        self.root_schema = schema
        self.rules: dict[str, str] = {"space": _BASICS["space"]}

    def basic(self, name: str) -> str:
        if name not in self.rules:
            self.rules[name] = _BASICS[name]
            for dep in _NEEDS.get(name, []):
                self.basic(dep)
        return name

    def add(self, name: str, body: str) -> str:
        name = re.sub(r"[^a-zA-Z0-9-]+", "-", name) or "root"
        if name in _BASICS and name != "root":
            name += "-"
        base, i = name, 0
        while name in self.rules and self.rules[name] != body:
            i += 1
            name = f"{base}{i}"
        self.rules[name] = body
        return name

    def ref(self, ref: str) -> Any:
        if not ref.startswith("#/"):
            raise ValueError(f"$ref {ref!r}: only local references (#/definitions/..., #/$defs/...) are supported")
        node = self.root_schema
        for part in ref[2:].split("/"):
            if not isinstance(node, dict) or part not in node:
                raise ValueError(f"$ref {ref!r} points to nothing in the schema")
            node = node[part]
        return node

    def visit(self, s: Any, name: str) -> str:
        if s is True or s == {}:
            return self.basic("value")
        if not isinstance(s, dict):
            raise ValueError(f"a JSON schema must be an object, got {s!r}")
        unknown = sorted(set(s) - _KNOWN)
        if unknown:
            raise ValueError(f"JSON schema keyword(s) {', '.join(unknown)} are not supported by "
                             "LlamaGrammar.from_json_schema: write the grammar in GBNF (LlamaGrammar.from_string)")
        t = s.get("type")
        sub = lambda suffix: f"{name}{'-' if name else ''}{suffix}"  # noqa: E731
        if "$ref" in s:
            return self.visit(self.ref(s["$ref"]), name or "ref")
        if "oneOf" in s or "anyOf" in s:
            alts = s.get("oneOf") or s["anyOf"]
            return self.add(name, " | ".join(self.visit(a, f"{name}-{i}" if name else f"alternative-{i}")
                                             for i, a in enumerate(alts)))
        if isinstance(t, list):
            return self.add(name, " | ".join(self.visit({"type": x}, f"{name}-{i}" if name else f"alternative-{i}")
                                             for i, x in enumerate(t)))
        if "const" in s:
            return self.add(name, _literal(json.dumps(s["const"])))
        if "enum" in s:
            return self.add(name, " | ".join(_literal(json.dumps(v)) for v in s["enum"]))
        extra = s.get("additionalProperties")
        if t in (None, "object") and ("properties" in s or ("additionalProperties" in s and extra is not True)):
            return self.add(name, self.object(list(s.get("properties", {}).items()), set(s.get("required", [])),
                                              name, extra))
        if t in (None, "array") and ("items" in s or "prefixItems" in s):
            items = s.get("items") or s["prefixItems"]
            if isinstance(items, list):
                parts = ' "," space '.join(self.visit(x, sub(f"tuple-{i}")) for i, x in enumerate(items))
                return self.add(name, f'"[" space {parts} "]" space')
            item = self.visit(items, sub("item"))
            body = _repeat(item, s.get("minItems", 0), s.get("maxItems"), '"," space')
            return self.add(name, f'"[" space {body} "]" space')
        if t == "string" and ("minLength" in s or "maxLength" in s):
            char = self.basic("char")
            return self.add(name, rf'"\"" {_repeat(char, s.get("minLength", 0), s.get("maxLength"))} "\"" space')
        if t == "object" or not (set(s) - {"title", "description", "default", "examples", "$schema", "$id"}):
            return self.add(name, self.basic("object")) if name else self.add("root", "object")
        if t not in ("boolean", "null", "number", "integer", "string", "array"):
            raise ValueError(f"JSON schema type {t!r} is not supported by LlamaGrammar.from_json_schema")
        self.basic(t)
        return self.add("root", t) if not name else t

    def object(self, props: list[tuple[str, Any]], required: set[str], name: str, extra: Any) -> str:
        sub = lambda suffix: f"{name}{'-' if name else ''}{suffix}"  # noqa: E731
        kv = {}
        for key, schema in props:
            kv[key] = self.add(sub(f"{key}-kv"), f'{_literal(json.dumps(key))} space ":" space '
                                                 f'{self.visit(schema, sub(key))}')
        req = [k for k, _ in props if k in required]
        opt = [k for k, _ in props if k not in required]
        if extra is True or isinstance(extra, dict):
            value = self.visit({} if extra is True else extra, sub("additional-value"))
            kv["*"] = self.add(sub("additional-kv"), f'{self.basic("string")} ":" space {value}')
            opt.append("*")
        body = '"{" space ' + ' "," space '.join(kv[k] for k in req)
        if opt:
            def chain(keys: list[str], first_optional: bool) -> str:
                k, rest = keys[0], keys[1:]
                if k == "*":
                    out = self.add(sub("additional-kvs"), f'{kv[k]} ( "," space {kv[k]} )*')
                else:
                    out = f'( "," space {kv[k]} )?' if first_optional else kv[k]
                if rest:
                    out += " " + self.add(sub(f"{k}-rest"), chain(rest, True))
                return out
            alts = " | ".join(chain(opt[i:], False) for i in range(len(opt)))
            body += f' ( "," space ( {alts} ) )?' if req else f" ( {alts} )?"
        return body + ' "}" space'


def json_schema_to_gbnf(schema: str | dict[str, Any]) -> str:
    """A GBNF grammar accepting the JSON texts `schema` describes (see the module's docstring)."""
    try:
        s = json.loads(schema) if isinstance(schema, str) else schema
    except json.JSONDecodeError as e:
        raise ValueError(f"the JSON schema does not parse: {e}") from None
    c = _Converter(s)
    top = c.visit(s, "")
    if top != "root":
        c.rules["root"] = top
    return "\n".join(f"{n} ::= {r}" for n, r in sorted(c.rules.items()))
