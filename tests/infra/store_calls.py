"""What the worker asks of DynamoDB, read from worker/store/ without running it.

Every DynamoDB call in worker/store/ has the form ``self._call("operation", ...)`` with a
literal operation name, and the items of a transaction are dicts keyed ``"Update"``,
``"Put"``, ``"ConditionCheck"`` or ``"Delete"``. From that, for every method of every class
in every module under worker/store/:

- the DynamoDB operations it sends, directly or through other methods of those classes
  (``self.helper()``, or ``self.<part>.method()`` when a store is composed of others);
- the transaction item kinds it sends;
- for each UpdateItem it sends, alone or inside a transaction, the table and the
  attribute names the request names: those of the codec's expression builders it uses
  (called with sample arguments, every branch) and of any ``ExpressionAttributeNames``
  or expression text written in place.

Anything that does not fit these forms raises ``DiscoveryError`` naming the file and line,
so a new call is never silently left out of the IAM comparison.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import re
import types
import typing
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from worker.store import codec

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "worker"
STORE = WORKER / "store"

TRANSACTION_KINDS = {
    "Update": "dynamodb:UpdateItem",
    "Put": "dynamodb:PutItem",
    "Delete": "dynamodb:DeleteItem",
    "ConditionCheck": "dynamodb:ConditionCheckItem",
    "Get": "dynamodb:GetItem",
}
TRANSACTION_OPERATIONS = {"transact_write_items", "transact_get_items"}

# Receivers of store calls in the rest of the worker are recognised by name:
# self.store, self.sink, self._leases, admin, self.fleet, lease_store, ...
STORE_RECEIVER = re.compile(r"(store|sink|leases|admin|fleet)$", re.IGNORECASE)

# Words of DynamoDB's expression language that are not attribute names.
EXPRESSION_WORDS = frozenset(
    w.lower() for w in (
        "AND", "OR", "NOT", "BETWEEN", "IN", "SET", "REMOVE", "ADD", "DELETE",
        "attribute_exists", "attribute_not_exists", "attribute_type", "begins_with",
        "contains", "size", "if_not_exists", "list_append",
    )
)


class DiscoveryError(AssertionError):
    """Code in worker/store/ this reader cannot account for."""


@dataclass(frozen=True)
class UpdateSite:
    """One UpdateItem request in the source: where, on which table, naming what."""

    where: str  # path:line
    table: str  # "streams", "events" or "fleet", from the TableName expression
    attributes: frozenset[str]


@dataclass
class Method:
    cls: str
    name: str
    where: str
    operations: set[str] = field(default_factory=set)
    transaction_kinds: set[str] = field(default_factory=set)
    helpers: set[str] = field(default_factory=set)
    updates: list[UpdateSite] = field(default_factory=list)


@dataclass(frozen=True)
class Needs:
    """What a set of store methods needs, closed over their helpers."""

    operations: frozenset[str]
    transaction_kinds: frozenset[str]
    updates: tuple[UpdateSite, ...]

    def iam_actions(self) -> frozenset[str]:
        actions = {iam_action(op) for op in self.operations - TRANSACTION_OPERATIONS}
        actions |= {TRANSACTION_KINDS[k] for k in self.transaction_kinds}
        return frozenset(actions)

    def transaction_only_actions(self) -> frozenset[str]:
        """Item actions sent only inside a transaction, never as requests of their own."""
        direct = {iam_action(op) for op in self.operations - TRANSACTION_OPERATIONS}
        return frozenset({TRANSACTION_KINDS[k] for k in self.transaction_kinds} - direct)

    def updated_attributes(self, table: str) -> frozenset[str]:
        return frozenset().union(*(u.attributes for u in self.updates if u.table == table))


def iam_action(operation: str) -> str:
    return "dynamodb:" + "".join(w.title() for w in operation.split("_"))


# --- reading worker/store/ ----------------------------------------------------------------


def store_methods(store_dir: Path = STORE) -> dict[str, list[Method]]:
    """Every method of every class under ``store_dir``, by name."""
    found: dict[str, list[Method]] = {}
    for path in sorted(store_dir.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            for fn in cls.body:
                if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                    method = _read_method(path, cls.name, fn)
                    found.setdefault(method.name, []).append(method)
    return found


def _where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"


def _read_method(path: Path, cls: str, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> Method:
    method = Method(cls, fn.name, _where(path, fn))
    builders = _builder_assignments(fn)
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            receiver = node.func.value
            if isinstance(receiver, ast.Name) and receiver.id == "self":
                if node.func.attr == "_call":
                    operation = _literal_operation(path, node)
                    method.operations.add(operation)
                    if operation == "update_item":
                        method.updates.append(_update_site(path, node, _call_fields(node),
                                                           builders))
                else:
                    method.helpers.add(node.func.attr)
            elif (isinstance(receiver, ast.Attribute) and isinstance(receiver.value, ast.Name)
                  and receiver.value.id == "self"):
                method.helpers.add(node.func.attr)  # self.<part>.method(...)
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value in TRANSACTION_KINDS:
                    method.transaction_kinds.add(str(key.value))
                    if key.value == "Update":
                        if not isinstance(value, ast.Dict):
                            raise DiscoveryError(
                                f"{_where(path, node)}: a transaction Update that is not a "
                                "dict literal; write it in place so its attributes can be read")
                        method.updates.append(_update_site(path, value, _dict_fields(value),
                                                           builders))
    return method


def _literal_operation(path: Path, call: ast.Call) -> str:
    if not call.args or not isinstance(call.args[0], ast.Constant) \
            or not isinstance(call.args[0].value, str):
        raise DiscoveryError(f"{_where(path, call)}: self._call needs a literal operation "
                             f"name: {ast.unparse(call)[:120]}")
    return call.args[0].value


def _call_fields(call: ast.Call) -> list[tuple[str | None, ast.expr]]:
    return [(k.arg, k.value) for k in call.keywords]


def _dict_fields(node: ast.Dict) -> list[tuple[str | None, ast.expr]]:
    out: list[tuple[str | None, ast.expr]] = []
    for key, value in zip(node.keys, node.values, strict=True):
        if key is None:
            out.append((None, value))
        elif isinstance(key, ast.Constant) and isinstance(key.value, str):
            out.append((key.value, value))
    return out


def _builder_assignments(fn: ast.AST) -> dict[str, str]:
    """Local names bound to a codec expression builder's result: ``expr = codec.f(...)``."""
    out: dict[str, str] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name):
            builder = _codec_call(node.value)
            if builder is not None:
                out[node.targets[0].id] = builder
    return out


def _codec_call(node: ast.expr) -> str | None:
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "codec"):
        return node.func.attr
    return None


def _update_site(path: Path, node: ast.AST, fields: list[tuple[str | None, ast.expr]],
                 builders: dict[str, str]) -> UpdateSite:
    where = _where(path, node)
    table_expr: ast.expr | None = None
    names: set[str] = set()
    accounted = False
    for key, value in fields:
        if key == "TableName":
            table_expr = value
        elif key == "ExpressionAttributeNames":
            names |= _literal_names(where, value)
            accounted = True
        elif key in ("UpdateExpression", "ConditionExpression"):
            if not (isinstance(value, ast.Constant) and isinstance(value.value, str)):
                raise DiscoveryError(f"{where}: {key} is not a literal string")
            names |= bare_attribute_names(value.value)
        elif key is None:  # **expr.update_kwargs()
            builder = _builder_of(value, builders)
            if builder is None:
                raise DiscoveryError(f"{where}: cannot read **{ast.unparse(value)}")
            names |= builder_attributes(builder)
            accounted = True
        elif key == "Key":
            names |= _key_names(where, value)
    if table_expr is None:
        raise DiscoveryError(f"{where}: an UpdateItem without a TableName")
    if not accounted:
        raise DiscoveryError(f"{where}: cannot tell which attributes this UpdateItem names "
                             "(no codec expression builder, no ExpressionAttributeNames)")
    return UpdateSite(where, table_of(ast.unparse(table_expr)), frozenset(names))


def _builder_of(value: ast.expr, builders: dict[str, str]) -> str | None:
    if (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
            and value.func.attr == "update_kwargs"):
        target = value.func.value
        if isinstance(target, ast.Name):
            return builders.get(target.id)
        return _codec_call(target)
    return None


def _literal_names(where: str, node: ast.expr) -> set[str]:
    if not isinstance(node, ast.Dict):
        raise DiscoveryError(f"{where}: ExpressionAttributeNames is not a dict literal")
    return {_string_value(where, v) for v in node.values}


def _key_names(where: str, node: ast.expr) -> set[str]:
    if isinstance(node, ast.Dict):
        return {_string_value(where, k) for k in node.keys if k is not None}
    return set()  # codec.key(...): the table's key, which the IAM list holds anyway


def _string_value(where: str, node: ast.expr | None) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id == "codec"):
        value = getattr(codec, node.attr)
        if isinstance(value, str):
            return value
    shown = ast.unparse(node) if node is not None else "None"
    raise DiscoveryError(f"{where}: attribute name {shown} is neither a string nor a "
                         "codec constant")


def table_of(expression: str) -> str:
    """Which table a TableName expression (``self.events_table``, ...) refers to."""
    lowered = expression.lower()
    if "event" in lowered:
        return "events"
    if "fleet" in lowered:
        return "fleet"
    return "streams"


# --- the codec's expression builders --------------------------------------------------------


def bare_attribute_names(expression: str) -> set[str]:
    """Attribute names written without a ``#placeholder`` in an expression."""
    found = set()
    for word in re.findall(r"[#:]?[A-Za-z_][A-Za-z0-9_]*", expression):
        if word[0] not in "#:" and word.lower() not in EXPRESSION_WORDS:
            found.add(word)
    return found


def builder_attributes(name: str) -> frozenset[str]:
    """Every attribute name one codec builder's expressions can name, over all branches."""
    fn = getattr(codec, name, None)
    if fn is None or not callable(fn):
        raise DiscoveryError(f"codec.{name} is not a function")
    hints = typing.get_type_hints(fn)
    if hints.get("return") is not codec.Expr:
        raise DiscoveryError(f"codec.{name} does not return an Expr")
    names: set[str] = set()
    for args in _sample_arguments(fn, hints):
        expr = fn(**args)
        names |= set(expr.names.values())
        for text in (expr.condition, expr.update or ""):
            names |= bare_attribute_names(text)
    return frozenset(names)


def _sample_arguments(fn: Callable[..., Any], hints: dict[str, Any]) -> Iterator[dict[str, Any]]:
    params = [p for p in inspect.signature(fn).parameters.values()]
    choices = [_samples(hints[p.name], f"codec.{fn.__name__}({p.name})") for p in params]
    combos = list(itertools.product(*choices))
    if len(combos) > 256:
        raise DiscoveryError(f"codec.{fn.__name__}: too many argument combinations to try")
    for combo in combos:
        yield {p.name: value for p, value in zip(params, combo, strict=True)}


def _samples(hint: Any, where: str) -> list[Any]:
    if hint is str:
        return ["x"]
    if hint is bool:
        return [False, True]
    if hint is int:
        return [0, 1]
    if hint is float:
        return [0.0, 1.0]
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        out: list[Any] = []
        for member in typing.get_args(hint):
            out.extend([None] if member is type(None) else _samples(member, where))
        return out
    raise DiscoveryError(f"{where}: no sample values for {hint!r}")


# --- who calls what -------------------------------------------------------------------------


def needs(method_names: Iterable[str], methods: dict[str, list[Method]] | None = None) -> Needs:
    """What these store methods send, with every helper they reach."""
    methods = store_methods() if methods is None else methods
    seen: set[int] = set()
    queue = [m for name in method_names for m in methods.get(name, [])]
    operations: set[str] = set()
    kinds: set[str] = set()
    updates: list[UpdateSite] = []
    while queue:
        method = queue.pop()
        if id(method) in seen:
            continue
        seen.add(id(method))
        operations |= method.operations
        kinds |= method.transaction_kinds
        updates.extend(method.updates)
        for helper in method.helpers:
            same_class = [m for m in methods.get(helper, []) if m.cls == method.cls]
            queue.extend(same_class or methods.get(helper, []))
    return Needs(frozenset(operations), frozenset(kinds), tuple(updates))


def methods_called(files: Iterable[Path], methods: dict[str, list[Method]] | None = None
                   ) -> set[str]:
    """Store methods called on a store-like receiver (see STORE_RECEIVER) in these files."""
    methods = store_methods() if methods is None else methods
    found = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in methods
                    and STORE_RECEIVER.search(ast.unparse(node.func.value))):
                found.add(node.func.attr)
    return found


def worker_run_files() -> list[Path]:
    """The code ``streamlease run`` executes outside the store: not the CLI, not dev/."""
    return sorted(p for p in WORKER.rglob("*.py")
                  if p.name != "cli.py" and not {"dev", "store"} & set(p.relative_to(WORKER).parts))


def operator_files() -> list[Path]:
    """The code behind ``streamlease ctl`` and ``table create``."""
    return [WORKER / "cli.py"]
