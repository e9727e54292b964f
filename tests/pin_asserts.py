"""What the pinned upstream's model graphs assert about head sizes, read from its source.

Each architecture's graph (src/models/*.cpp at the pin) may assert that the rope dimension count equals a head size
(`GGML_ASSERT(n_embd_head == n_rot)`) or that key_length equals value_length
(`GGML_ASSERT(n_embd_head == hparams.n_embd_head_k())` where n_embd_head is the V size). A header that breaks a live
assert aborts the process at the first graph, so the loader refuses it (patch 0016); a header that breaks an assert
upstream commented out (MiniMax, Nemotron: their published files rotate half a head) runs, and must load.

`graph_head_asserts(root)` maps each architecture name (as in a GGUF's general.architecture) to the equalities its
graph asserts: a frozenset of "rot=k", "rot=v", "k=v". Only live asserts count (comments are stripped), only asserts
on the whole-model sizes (a per-layer `(il)` form is left to the graph), and an architecture inherits the asserts of
every class whose members its own graph builder names.
"""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

_SIZE_TERMS = {
    "n_rot": "rot", "hparams.n_rot()": "rot", "n_rot()": "rot",
    "hparams.n_embd_head_k()": "k", "n_embd_head_k": "k", "n_embd_head_k()": "k",
    "hparams.n_embd_head_v()": "v", "n_embd_head_v": "v", "n_embd_head_v()": "v",
}


def strip_comments(src: str) -> str:
    """C++ source without its comments (string literals kept; a `//` inside one is rare in these files)."""
    src = re.sub(r"/\*.*?\*/", " ", src, flags=re.S)
    return re.sub(r"//[^\n]*", "", src)


def _body(src: str, start: int) -> str:
    """The braced body that starts at the first '{' at or after `start`."""
    i = src.index("{", start)
    depth = 0
    for j in range(i, len(src)):
        if src[j] == "{":
            depth += 1
        elif src[j] == "}":
            depth -= 1
            if depth == 0:
                return src[i:j + 1]
    raise ValueError("unbalanced braces")


def _arch_names(root: Path) -> dict[str, str]:
    """LLM_ARCH_X -> the architecture's name in a GGUF ("minimax-m2")."""
    src = (root / "src" / "llama-arch.cpp").read_text()
    return dict(re.findall(r"\{\s*(LLM_ARCH_\w+)\s*,\s*\"([^\"]+)\"\s*\}", src))


def _classes(root: Path) -> dict[str, str]:
    """LLM_ARCH_X -> the model class the factory makes for it (llama_model_mapping in src/llama-model.cpp)."""
    src = strip_comments((root / "src" / "llama-model.cpp").read_text())
    body = _body(src, src.index("llama_model_mapping("))
    out: dict[str, str] = {}
    pending: list[str] = []
    for m in re.finditer(r"case\s+(LLM_ARCH_\w+)\s*:|return\s+new\s+(llama_model_\w+)\s*\(", body):
        if m.group(1):
            pending.append(m.group(1))
        else:
            for a in pending:
                out[a] = m.group(2)
            pending = []
    return out


def _bases(root: Path) -> dict[str, str]:
    src = strip_comments((root / "src" / "models" / "models.h").read_text())
    return dict(re.findall(r"struct\s+(llama_model_\w+)\s*:\s*public\s+(llama_model_\w+)", src))


def _aliases(root: Path) -> dict[str, set[str]]:
    """class -> the other classes whose members its declaration aliases (`using graph = llama_model_granite::graph`)."""
    src = strip_comments((root / "src" / "models" / "models.h").read_text())
    out: dict[str, set[str]] = {}
    for m in re.finditer(r"struct\s+(llama_model_\w+)[^{;]*\{", src):
        body = _body(src, m.start())
        out[m.group(1)] = set(re.findall(r"\busing\s+\w+\s*=\s*(llama_model_\w+)::", body)) - {m.group(1)}
    return out


def _member_bodies(root: Path) -> dict[str, list[tuple[str, str]]]:
    """class -> [(member name, body)] of every member function defined in src/models/*.cpp (nested graph structs'
    constructors count as members of their class)."""
    out: dict[str, list[tuple[str, str]]] = {}
    pat = re.compile(r"^[^\n;{}]*?\b(llama_model_\w+)::((?:\w+(?:<[^>]*>)?::)*~?\w+)\s*\(", re.M)
    for f in sorted((root / "src" / "models").glob("*.cpp")):
        src = strip_comments(f.read_text())
        for m in pat.finditer(src):
            # a definition: the parameter list is followed by an optional initializer list, then the body
            rest = src[m.end():]
            depth, k = 1, 0
            while depth and k < len(rest):
                depth += {"(": 1, ")": -1}.get(rest[k], 0)
                k += 1
            tail = rest[k:k + 400]
            if not re.match(r"\s*(const\s*)?(override\s*)?(:[^;{]*)?\{", tail, re.S):
                continue
            out.setdefault(m.group(1), []).append((m.group(2), _body(src, m.end() + k)))
    return out


def _equalities(body: str) -> set[str]:
    found: set[str] = set()
    local = dict(re.findall(r"\bconst\s+(?:int64_t|uint32_t|int32_t|int|auto)\s+(n_embd_head)\s*=\s*"
                            r"(?:hparams\.)?(n_embd_head_[kv])\s*\(\s*\)\s*;", body))
    for m in re.finditer(r"GGML_ASSERT\s*\(", body):
        expr = _body(body.replace("(", "{").replace(")", "}"), m.end() - 1)[1:-1]
        expr = expr.replace("{", "(").replace("}", ")")
        for clause in re.split(r"&&", expr):
            sides = [s.strip() for s in clause.split("==")]
            if len(sides) != 2:
                continue
            terms = []
            for s in sides:
                s = re.sub(r"\s+", "", s)
                if s == "n_embd_head" and "n_embd_head" in local:
                    s = local["n_embd_head"]
                terms.append(_SIZE_TERMS.get(s))
            if None in terms or terms[0] == terms[1]:
                continue
            found.add("=".join(sorted(terms, key=["rot", "k", "v"].index)))
    return found


@lru_cache(maxsize=None)
def graph_head_asserts(root: Path) -> dict[str, frozenset[str]]:
    names = _arch_names(root)
    classes = _classes(root)
    bases = _bases(root)
    aliases = _aliases(root)
    members = _member_bodies(root)

    def asserts_of(cls: str, seen: frozenset[str] = frozenset()) -> set[str]:
        if cls in seen:
            return set()
        seen = seen | {cls}
        bodies = members.get(cls, [])
        if not any(name == "build_arch_graph" for name, _ in bodies) and cls in bases:
            return asserts_of(bases[cls], seen)
        out: set[str] = set()
        for other in aliases.get(cls, ()):
            out |= asserts_of(other, seen)
        for name, body in bodies:
            if name.startswith(("load_arch_hparams", "load_arch_tensors")):
                continue
            out |= _equalities(body)
            if name == "build_arch_graph":
                for other in set(re.findall(r"\b(llama_model_\w+)::", body)) - {cls}:
                    out |= asserts_of(other, seen)
                # `graph` named without a class, in a class that defines none: its base class's graph
                own_graph = any(n.startswith("graph") for n, _ in bodies)
                if not own_graph and cls in bases and re.search(r"(?<!::)\bgraph\b", body):
                    out |= asserts_of(bases[cls], seen)
        return out

    return {names[a]: frozenset(asserts_of(c)) for a, c in classes.items() if a in names}
