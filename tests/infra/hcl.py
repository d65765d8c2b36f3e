"""Terraform, read offline: python-hcl2 parses, and a small evaluator computes the part of
HCL this repository's module uses (no terraform binary is obtainable here).

python-hcl2 (8.x) keeps string literals quoted (``'"Pk"'``) and hands every other
expression back as source text (``'${var.x > 0}'``). ``evaluate`` turns both into
Python values: ``var.*`` from the given variables, ``local.*`` from the module's locals,
and anything known only after apply (``aws_dynamodb_table.streams.arn``, data sources) as
an ``Unknown`` that renders as ``${...}`` inside strings. ``jsonencode`` returns the
structure itself, so a container definition can be inspected as a dict.

Supported: literals, templates, lists, objects, ``for`` expressions, conditionals,
arithmetic, comparison and logic operators, indexing, and the functions in ``FUNCTIONS``.
Anything else raises ``HclError``, so a test never passes on an expression it could not
read.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hcl2

ROOT = Path(__file__).resolve().parents[2]
TERRAFORM = ROOT / "terraform"
MODULE_DIR = TERRAFORM / "modules" / "streamlease"
EXAMPLE_DIR = TERRAFORM / "examples" / "ecs-fargate"


class HclError(Exception):
    """An expression this evaluator does not support, or one that fails as terraform would."""


@dataclass(frozen=True)
class Unknown:
    """A value known only after apply, e.g. ``aws_dynamodb_table.streams.arn``."""

    ref: str

    def __str__(self) -> str:
        return "${" + self.ref + "}"


# --- loading ----------------------------------------------------------------------------


def tf_files(directory: Path = TERRAFORM) -> list[Path]:
    return sorted(p for p in directory.rglob("*.tf") if ".terraform" not in p.parts)


def parse_file(path: Path) -> dict[str, Any]:
    """python-hcl2's dict with block labels and keys unquoted; raises on syntax errors."""
    with path.open() as handle:
        data = hcl2.load(handle)
    cleaned = _clean(data)
    assert isinstance(cleaned, dict)
    return cleaned


def _clean(value: Any) -> Any:
    if isinstance(value, dict):
        # python-hcl2 adds __is_block__, __comments__, __inline_comments__: not terraform.
        return {_unquote(k): _clean(v) for k, v in value.items() if not k.startswith("__")}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def _unquote(key: str) -> str:
    if len(key) >= 2 and key[0] == key[-1] == '"':
        return key[1:-1]
    return key


@dataclass
class Module:
    """The top-level blocks of one terraform directory."""

    directory: Path
    variables: dict[str, dict[str, Any]] = field(default_factory=dict)
    locals: dict[str, Any] = field(default_factory=dict)
    resources: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    data: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    module_calls: dict[str, dict[str, Any]] = field(default_factory=dict)
    terraform: list[dict[str, Any]] = field(default_factory=list)
    providers: list[dict[str, Any]] = field(default_factory=list)

    def resource(self, rtype: str, name: str) -> dict[str, Any]:
        return self.resources[(rtype, name)]

    def resources_of(self, rtype: str) -> dict[str, dict[str, Any]]:
        return {n: body for (t, n), body in self.resources.items() if t == rtype}

    def defaults(self) -> dict[str, Any]:
        """Every variable's default (variables without one are left out)."""
        return {
            name: evaluate(block["default"], Scope(self, {}))
            for name, block in self.variables.items() if "default" in block
        }

    def scope(self, **overrides: Any) -> Scope:
        values = self.defaults()
        values.update(overrides)
        return Scope(self, values)


def load_module(directory: Path) -> Module:
    module = Module(directory)
    for path in sorted(directory.glob("*.tf")):
        parsed = parse_file(path)
        for block in parsed.get("variable", []):
            module.variables.update(block)
        for block in parsed.get("locals", []):
            for key, value in block.items():
                if key in module.locals:
                    raise HclError(f"local.{key} defined twice")
                module.locals[key] = value
        for kind, target in (("resource", module.resources), ("data", module.data)):
            for block in parsed.get(kind, []):
                for rtype, named in block.items():
                    for name, body in named.items():
                        target[(rtype, name)] = body
        for block in parsed.get("output", []):
            module.outputs.update(block)
        for block in parsed.get("module", []):
            module.module_calls.update(block)
        module.terraform.extend(parsed.get("terraform", []))
        module.providers.extend(parsed.get("provider", []))
    return module


def blocks(body: Mapping[str, Any], name: str) -> list[dict[str, Any]]:
    """Nested blocks of one kind (python-hcl2 gives a list of dicts)."""
    found = body.get(name, [])
    assert isinstance(found, list), f"{name} is not a block"
    return found


def dynamic_blocks(body: Mapping[str, Any], name: str) -> list[dict[str, Any]]:
    return [d[name] for d in blocks(body, "dynamic") if name in d]


# --- evaluation ---------------------------------------------------------------------------


@dataclass
class Scope:
    module: Module
    variables: dict[str, Any]
    names: dict[str, Any] = field(default_factory=dict)  # for-expression and dynamic iterators
    _locals: dict[str, Any] = field(default_factory=dict)

    def with_names(self, **names: Any) -> Scope:
        return Scope(self.module, self.variables, {**self.names, **names}, self._locals)

    def local(self, name: str) -> Any:
        if name not in self._locals:
            if name not in self.module.locals:
                raise HclError(f"no local.{name}")
            self._locals[name] = evaluate(self.module.locals[name], Scope(
                self.module, self.variables, {}, self._locals))
        return self._locals[name]


def evaluate(value: Any, scope: Scope) -> Any:
    """A python-hcl2 value (literal, list, dict or expression text) as a Python value."""
    if isinstance(value, list):
        return [evaluate(v, scope) for v in value]
    if isinstance(value, dict):
        return {k: evaluate(v, scope) for k, v in value.items()}
    if isinstance(value, str):
        return evaluate_source(expression_source(value), scope)
    return value


def expression_source(value: str) -> str:
    """python-hcl2's text of an attribute as HCL expression source."""
    if value.startswith('"'):
        return value  # a quoted template
    if value.startswith("${") and value.endswith("}") and _matching_brace(value, 1) == len(
            value) - 1:
        return value[2:-1]
    raise HclError(f"unexpected python-hcl2 value {value!r}")


def evaluate_source(source: str, scope: Scope) -> Any:
    parser = _Parser(_tokens(source), source)
    node = parser.expression()
    parser.expect_end()
    return _eval(node, scope)


def condition_holds(condition: Any, scope: Scope) -> bool:
    result = evaluate(condition, scope)
    if not isinstance(result, bool):
        raise HclError(f"condition {condition!r} gave {result!r}, not a bool")
    return result


def validation_errors(module: Module, name: str, value: Any) -> list[str]:
    """The error messages of ``name``'s validations that ``value`` fails.

    The scope holds this one variable only: before terraform 1.9 a validation may not
    reference any other, and this module claims to work from 1.5.
    """
    messages = []
    scope = Scope(module, {name: value})
    for rule in blocks(module.variables[name], "validation"):
        if not condition_holds(rule["condition"], scope):
            messages.append(str(evaluate(rule["error_message"], scope)))
    return messages


def preconditions(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for lifecycle in blocks(body, "lifecycle"):
        found.extend(blocks(lifecycle, "precondition"))
    return found


# --- tokens ---------------------------------------------------------------------------------

_PUNCT = ("...", "==", "!=", "<=", ">=", "&&", "||", "=>",
          "<", ">", "+", "-", "*", "/", "%", "!", "?", ":", "(", ")", "[", "]", "{", "}",
          ",", ".", "=")
_NUMBER = re.compile(r"\d+(\.\d+)?([eE][+-]?\d+)?")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


@dataclass(frozen=True)
class _Tok:
    kind: str  # num, str, ident, punct, end
    value: Any
    pos: int


def _matching_brace(text: str, open_at: int) -> int:
    """Index of the ``}`` closing the ``{`` at ``open_at``, skipping nested strings."""
    depth = 0
    i = open_at
    while i < len(text):
        c = text[i]
        if c == '"':
            i = _string_end(text, i)
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise HclError(f"unbalanced braces in {text!r}")


def _string_end(text: str, start: int) -> int:
    """Index just past the string literal opening at ``start``."""
    i = start + 1
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if text.startswith("${", i) or text.startswith("%{", i):
            i = _matching_brace(text, i + 1) + 1
            continue
        if c == '"':
            return i + 1
        i += 1
    raise HclError(f"unterminated string in {text!r}")


def _tokens(source: str) -> list[_Tok]:
    out: list[_Tok] = []
    i = 0
    while i < len(source):
        c = source[i]
        if c.isspace():
            i += 1
            continue
        if c == '"':
            end = _string_end(source, i)
            out.append(_Tok("str", source[i + 1:end - 1], i))
            i = end
            continue
        m = _NUMBER.match(source, i)
        if m:
            text = m.group(0)
            out.append(_Tok("num", float(text) if any(x in text for x in ".eE") else int(text),
                            i))
            i = m.end()
            continue
        m = _IDENT.match(source, i)
        if m:
            out.append(_Tok("ident", m.group(0), i))
            i = m.end()
            continue
        for p in _PUNCT:
            if source.startswith(p, i):
                out.append(_Tok("punct", p, i))
                i += len(p)
                break
        else:
            raise HclError(f"unexpected {c!r} at {i} in {source!r}")
    out.append(_Tok("end", None, len(source)))
    return out


# --- parser: nodes are tuples (kind, ...) ---------------------------------------------------

_BINARY = [("||",), ("&&",), ("==", "!="), ("<", "<=", ">", ">="), ("+", "-"), ("*", "/", "%")]


class _Parser:
    def __init__(self, tokens: list[_Tok], source: str) -> None:
        self.toks = tokens
        self.i = 0
        self.source = source

    def peek(self, offset: int = 0) -> _Tok:
        return self.toks[min(self.i + offset, len(self.toks) - 1)]

    def at(self, *punct: str) -> bool:
        tok = self.peek()
        return tok.kind == "punct" and tok.value in punct

    def at_ident(self, name: str) -> bool:
        tok = self.peek()
        return tok.kind == "ident" and tok.value == name

    def take(self) -> _Tok:
        tok = self.peek()
        self.i += 1
        return tok

    def expect(self, punct: str) -> None:
        tok = self.take()
        if tok.kind != "punct" or tok.value != punct:
            raise HclError(f"expected {punct!r} at {tok.pos} in {self.source!r}")

    def expect_end(self) -> None:
        if self.peek().kind != "end":
            raise HclError(f"trailing input at {self.peek().pos} in {self.source!r}")

    def expression(self) -> tuple[Any, ...]:
        cond = self.binary(0)
        if self.at("?"):
            self.take()
            yes = self.expression()
            self.expect(":")
            no = self.expression()
            return ("cond", cond, yes, no)
        return cond

    def binary(self, level: int) -> tuple[Any, ...]:
        if level == len(_BINARY):
            return self.unary()
        left = self.binary(level + 1)
        while self.at(*_BINARY[level]):
            op = self.take().value
            right = self.binary(level + 1)
            left = ("bin", op, left, right)
        return left

    def unary(self) -> tuple[Any, ...]:
        if self.at("!", "-"):
            op = self.take().value
            return ("unary", op, self.unary())
        return self.postfix(self.primary())

    def postfix(self, node: tuple[Any, ...]) -> tuple[Any, ...]:
        while True:
            if self.at("."):
                self.take()
                tok = self.take()
                if tok.kind not in ("ident", "num"):
                    raise HclError(f"bad attribute at {tok.pos} in {self.source!r}")
                node = ("getattr", node, str(tok.value))
            elif self.at("["):
                self.take()
                index = self.expression()
                self.expect("]")
                node = ("index", node, index)
            else:
                return node

    def primary(self) -> tuple[Any, ...]:
        tok = self.take()
        if tok.kind == "num":
            return ("lit", tok.value)
        if tok.kind == "str":
            return ("template", tok.value)
        if tok.kind == "ident":
            if tok.value in ("true", "false"):
                return ("lit", tok.value == "true")
            if tok.value == "null":
                return ("lit", None)
            if self.at("("):
                return self.call(tok.value)
            return ("name", tok.value)
        if tok.kind == "punct" and tok.value == "(":
            inner = self.expression()
            self.expect(")")
            return inner
        if tok.kind == "punct" and tok.value == "[":
            return self.list_or_for()
        if tok.kind == "punct" and tok.value == "{":
            return self.object_or_for()
        raise HclError(f"unexpected {tok.value!r} at {tok.pos} in {self.source!r}")

    def call(self, name: str) -> tuple[Any, ...]:
        self.expect("(")
        args = []
        while not self.at(")"):
            args.append(self.expression())
            if self.at("..."):
                raise HclError(f"argument expansion is not supported: {self.source!r}")
            if not self.at(")"):
                self.expect(",")
        self.expect(")")
        return ("call", name, args)

    def for_head(self) -> tuple[str | None, str, tuple[Any, ...]]:
        self.take()  # for
        first = self.take().value
        second = None
        if self.at(","):
            self.take()
            second = self.take().value
        if not self.at_ident("in"):
            raise HclError(f"expected 'in' in {self.source!r}")
        self.take()
        collection = self.expression()
        self.expect(":")
        if second is None:
            return None, first, collection
        return first, second, collection

    def for_condition(self) -> tuple[Any, ...] | None:
        if self.at_ident("if"):
            self.take()
            return self.expression()
        return None

    def list_or_for(self) -> tuple[Any, ...]:
        if self.at_ident("for"):
            key, val, coll = self.for_head()
            body = self.expression()
            cond = self.for_condition()
            self.expect("]")
            return ("forlist", key, val, coll, body, cond)
        items = []
        while not self.at("]"):
            items.append(self.expression())
            if not self.at("]"):
                self.expect(",")
        self.expect("]")
        return ("list", items)

    def object_or_for(self) -> tuple[Any, ...]:
        if self.at_ident("for"):
            key, val, coll = self.for_head()
            kexpr = self.expression()
            self.expect("=>")
            vexpr = self.expression()
            group = False
            if self.at("..."):
                self.take()
                group = True
            cond = self.for_condition()
            self.expect("}")
            return ("forobj", key, val, coll, kexpr, vexpr, group, cond)
        items: list[tuple[tuple[Any, ...], tuple[Any, ...]]] = []
        while not self.at("}"):
            tok = self.peek()
            if tok.kind == "ident" and self.peek(1).kind == "punct" and self.peek(1).value in (
                    "=", ":"):
                self.take()
                knode: tuple[Any, ...] = ("lit", tok.value)
            else:
                knode = self.expression()
            if not self.at("=", ":"):
                raise HclError(f"expected '=' in object at {self.peek().pos} in {self.source!r}")
            self.take()
            items.append((knode, self.expression()))
            if self.at(","):
                self.take()
        self.expect("}")
        return ("object", items)


# --- evaluation of nodes --------------------------------------------------------------------


def _eval(node: tuple[Any, ...], scope: Scope) -> Any:
    kind = node[0]
    if kind == "lit":
        return node[1]
    if kind == "template":
        return _template(node[1], scope)
    if kind == "list":
        return [_eval(n, scope) for n in node[1]]
    if kind == "object":
        out: dict[str, Any] = {}
        for knode, vnode in node[1]:
            out[str(_eval(knode, scope))] = _eval(vnode, scope)
        return out
    if kind == "name":
        return _name(node[1], scope)
    if kind == "getattr":
        base = _eval(node[1], scope)
        if isinstance(base, Unknown):
            return Unknown(f"{base.ref}.{node[2]}")
        if isinstance(base, dict) and node[2] in base:
            return base[node[2]]
        raise HclError(f"no attribute {node[2]!r} in {base!r}")
    if kind == "index":
        base = _eval(node[1], scope)
        index = _eval(node[2], scope)
        if isinstance(base, Unknown):
            return Unknown(f"{base.ref}[{index!r}]")
        try:
            return base[int(index) if isinstance(base, list) else index]
        except (KeyError, IndexError, TypeError) as exc:
            raise HclError(f"cannot index {base!r} with {index!r}") from exc
    if kind == "cond":
        cond = _eval(node[1], scope)
        if isinstance(cond, Unknown):
            return Unknown(f"({cond.ref} ? ...)")
        if not isinstance(cond, bool):
            raise HclError(f"condition is not a bool: {cond!r}")
        return _eval(node[2] if cond else node[3], scope)
    if kind == "unary":
        value = _eval(node[2], scope)
        if isinstance(value, Unknown):
            return value
        if node[1] == "!":
            if not isinstance(value, bool):
                raise HclError(f"! needs a bool, got {value!r}")
            return not value
        return -_number(value)
    if kind == "bin":
        return _binary(node[1], _eval(node[2], scope), _eval(node[3], scope))
    if kind == "call":
        return _call(node[1], node[2], scope)
    if kind in ("forlist", "forobj"):
        return _for(node, scope)
    raise HclError(f"unknown node {kind}")


def _name(name: str, scope: Scope) -> Any:
    if name in scope.names:
        return scope.names[name]
    if name == "var":
        return _VarProxy(scope)
    if name == "local":
        return _LocalProxy(scope)
    return Unknown(name)


class _VarProxy(dict[str, Any]):
    def __init__(self, scope: Scope) -> None:
        super().__init__()
        self.scope = scope

    def __contains__(self, key: object) -> bool:
        if key not in self.scope.variables:
            raise HclError(f"var.{key} is not in scope")
        return True

    def __getitem__(self, key: str) -> Any:
        if key not in self.scope.variables:
            raise HclError(f"var.{key} is not in scope")
        return self.scope.variables[key]


class _LocalProxy(dict[str, Any]):
    def __init__(self, scope: Scope) -> None:
        super().__init__()
        self.scope = scope

    def __contains__(self, key: object) -> bool:
        return True

    def __getitem__(self, key: str) -> Any:
        return self.scope.local(key)


def _template(text: str, scope: Scope) -> Any:
    parts: list[Any] = []
    i = 0
    literal: list[str] = []
    while i < len(text):
        if text.startswith("%{", i):
            raise HclError(f"template directives are not supported: {text!r}")
        if text.startswith("${", i):
            end = _matching_brace(text, i + 1)
            if literal:
                parts.append("".join(literal))
                literal = []
            parts.append(evaluate_source(text[i + 2:end], scope))
            i = end + 1
            continue
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            escapes = {"n": "\n", "t": "\t", '"': '"', "\\": "\\"}
            literal.append(escapes.get(text[i + 1], text[i + 1]))
            i += 2
            continue
        literal.append(c)
        i += 1
    if literal:
        parts.append("".join(literal))
    if len(parts) == 1 and not isinstance(parts[0], str):
        return parts[0]  # "${x}" alone keeps x's type, as in terraform
    return "".join(_tostring(p) for p in parts)


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise HclError(f"a number is required, got {value!r}")
    return value


def _binary(op: str, left: Any, right: Any) -> Any:
    if op in ("==", "!=") and None in (left, right) and (
            isinstance(left, Unknown) or isinstance(right, Unknown)):
        # Attributes known after apply here (names, ARNs) are never null.
        return op == "!="
    if isinstance(left, Unknown) or isinstance(right, Unknown):
        return Unknown(f"({left} {op} {right})")
    if op in ("&&", "||"):
        if not isinstance(left, bool) or not isinstance(right, bool):
            raise HclError(f"{op} needs bools, got {left!r} and {right!r}")
        return (left and right) if op == "&&" else (left or right)
    if op in ("==", "!="):
        # terraform: values of different types are never equal (true != 1).
        same = isinstance(left, bool) == isinstance(right, bool) and left == right
        return same if op == "==" else not same
    a, b = _number(left), _number(right)
    if op == "<":
        return a < b
    if op == "<=":
        return a <= b
    if op == ">":
        return a > b
    if op == ">=":
        return a >= b
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        if b == 0:
            raise HclError("division by zero")
        return a / b
    if op == "%":
        return math.fmod(a, b)
    raise HclError(f"operator {op}")


def _for(node: tuple[Any, ...], scope: Scope) -> Any:
    if node[0] == "forlist":
        _, kname, vname, coll, body, cond = node
    else:
        _, kname, vname, coll, kexpr, vexpr, group, cond = node
    collection = _eval(coll, scope)
    if isinstance(collection, Unknown):
        return collection
    pairs: Iterator[tuple[Any, Any]]
    if isinstance(collection, dict):
        pairs = iter(sorted(collection.items()))
    elif isinstance(collection, list):
        pairs = iter(enumerate(collection))
    else:
        raise HclError(f"cannot iterate {collection!r}")
    items = []
    for key, value in pairs:
        names = {vname: value}
        if kname is not None:
            names[kname] = key
        inner = scope.with_names(**names)
        if cond is not None:
            keep = _eval(cond, inner)
            if not isinstance(keep, bool):
                raise HclError(f"for condition gave {keep!r}")
            if not keep:
                continue
        if node[0] == "forlist":
            items.append(_eval(body, inner))
        else:
            items.append((_eval(kexpr, inner), _eval(vexpr, inner)))
    if node[0] == "forlist":
        return items
    out: dict[str, Any] = {}
    for k, v in items:
        if group:
            out.setdefault(str(k), []).append(v)
        elif str(k) in out:
            raise HclError(f"duplicate key {k!r} in for expression (use ... to group)")
        else:
            out[str(k)] = v
    return out


def _tostring(value: Any) -> str:
    if isinstance(value, Unknown):
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        if isinstance(value, float) and value.is_integer():
            return str(int(value))
        return repr(value) if isinstance(value, float) else str(value)
    if isinstance(value, str):
        return value
    raise HclError(f"cannot convert {value!r} to a string")


def _regex(pattern: str, text: str) -> Any:
    m = re.search(pattern, text)
    if m is None:
        raise HclError(f"pattern {pattern!r} does not match {text!r}")
    if m.re.groups:
        return list(m.groups())
    return m.group(0)


def _cidrnetmask(cidr: str) -> str:
    try:
        net = ipaddress.IPv4Network(cidr, strict=False)
    except ValueError as exc:
        raise HclError(f"invalid IPv4 CIDR {cidr!r}") from exc
    return str(net.netmask)


def _coalesce(*args: Any) -> Any:
    for arg in args:
        if arg is not None and arg != "":
            return arg
    raise HclError("coalesce: no non-null arguments")


def _format(spec: str, *args: Any) -> str:
    values = iter(args)
    return re.sub(r"%[sd]", lambda m: _tostring(next(values)), spec)


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "floor": lambda x: math.floor(_number(x)),
    "ceil": lambda x: math.ceil(_number(x)),
    "abs": lambda x: abs(_number(x)),
    "min": lambda *xs: min(_number(x) for x in xs),
    "max": lambda *xs: max(_number(x) for x in xs),
    "length": len,
    "contains": lambda coll, x: x in coll,
    "lower": lambda s: s.lower(),
    "upper": lambda s: s.upper(),
    "trimspace": lambda s: s.strip(),
    "startswith": lambda s, p: s.startswith(p),
    "endswith": lambda s, p: s.endswith(p),
    "strcontains": lambda s, p: p in s,
    "substr": lambda s, off, n: s[off:off + n] if n >= 0 else s[off:],
    "join": lambda sep, xs: sep.join(_tostring(x) for x in xs),
    "concat": lambda *ls: [x for lst in ls for x in lst],
    "flatten": lambda ls: [x for lst in ls for x in (lst if isinstance(lst, list) else [lst])],
    "distinct": lambda xs: list(dict.fromkeys(xs)),
    "alltrue": lambda xs: all(xs),
    "anytrue": lambda xs: any(xs),
    "coalesce": _coalesce,
    "tostring": _tostring,
    "tonumber": lambda x: float(x) if "." in str(x) else int(x),
    "regex": _regex,
    "cidrnetmask": _cidrnetmask,
    "format": _format,
    "merge": lambda *ds: {k: v for d in ds for k, v in d.items()},
    "keys": lambda d: sorted(d),
    "sort": lambda xs: sorted(xs),
    "jsonencode": lambda x: x,  # the structure, not text: tests inspect it
}


# Functions whose result stays readable with an unknown argument (rendered as ${ref}).
_RENDERS_UNKNOWN = frozenset({"jsonencode", "format", "join"})


def _call(name: str, args: list[tuple[Any, ...]], scope: Scope) -> Any:
    if name in ("can", "try"):
        for i, arg in enumerate(args):
            try:
                value = _eval(arg, scope)
            except (HclError, TypeError, AttributeError, KeyError):
                if name == "can":
                    return False
                if i == len(args) - 1:
                    raise
                continue
            return True if name == "can" else value
        raise HclError(f"{name}() with no arguments")
    if name not in FUNCTIONS:
        raise HclError(f"function {name}() is not supported by this evaluator")
    values = [_eval(a, scope) for a in args]
    if any(isinstance(v, Unknown) for v in values) and name not in _RENDERS_UNKNOWN:
        return Unknown(f"{name}(...)")
    try:
        return FUNCTIONS[name](*values)
    except HclError:
        raise
    except (TypeError, ValueError, AttributeError, KeyError) as exc:
        raise HclError(f"{name}({values!r}): {exc}") from exc
