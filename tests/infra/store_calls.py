"""What the worker and the operator commands ask of DynamoDB, read from streamlease/ without
running it.

The forms this reader relies on (anything else raises ``DiscoveryError`` naming the file
and line, so a new call is never silently left out of the IAM comparison):

- every DynamoDB call in streamlease/store/ is ``self._call("operation", ...)`` with a literal
  operation name, in a method of a store class;
- a transaction's items are dicts keyed ``"Update"``, ``"Put"``, ``"ConditionCheck"``,
  ``"Delete"`` or ``"Get"``: written in place, bound to a name in the same method
  (``put = {...}`` then ``{"Put": put}``), or returned by a codec function
  (``fleetcodec.leader_check(...)``);
- a request's ``TableName`` (a BatchGetItem's: each key of its ``RequestItems`` dict
  literal) is ``self.<attribute>``, an attribute the store's constructor sets from the
  ``table``, ``events_table`` or ``fleet_table`` argument that
  ``streamlease.store.dynamodb.connect`` passes it, or one of the run-time choices in
  ``RUNTIME_TABLES``;
- code outside the store reaches a store through a receiver named after its field of
  ``Stores`` (``self.leases``, ``stores.jobs``, ``self.backend`` for the leader backend,
  ...: ``ROLES``), and ``connect`` says which class fills each field;
- a write whose table the caller chooses (``LeaderBackend.fenced_write``) gets it from a
  ``PutItem(table, item, ...)`` built by a store method or, for ``job write``, from the
  ``--table`` argument;
- the change feed's store classes (``FEED_CLASSES``) are built outside ``connect`` (by the
  fleet leader's feed duty, and only with STREAMLEASE_CHANGE_FEED on), so their requests
  are taken from the classes themselves (``feed_methods``); a DynamoDB Streams request
  names a stream, never a table: it belongs to its reader's table; the reader reaches its
  checkpoint store through an attribute (``COLLABORATORS``).

From that, for every method of every store class: each request it sends (IAM action,
table, index, inside a transaction or not), for each UpdateItem the attribute names it
names (those of the codec's expression builders it uses, called with sample arguments
over every branch, and any written in place), and for each write to the fleet table the
partition keys it writes (the codec's key builders called with sample arguments, a
placeholder argument read back as ``*``).
"""

from __future__ import annotations

import ast
import collections.abc
import dataclasses
import enum
import functools
import inspect
import itertools
import re
import textwrap
import types
import typing
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamlease.store import codec, feedcheckpoints, fleetcodec, schema

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "streamlease"
STORE = WORKER / "store"
CONNECT = STORE / "dynamodb" / "__init__.py"
CODECS = {"codec": codec, "fleetcodec": fleetcodec, "fc": feedcheckpoints}

STREAMS, EVENTS, FLEET = "streams", "events", "fleet"
ALL_TABLES = (STREAMS, EVENTS, FLEET)
CALLER = "caller"  # the table of the PutItem the caller hands over
JOB_WRITE = "job_write"  # the tables `streamlease job write --table T` names
# connect()'s table arguments, named after STREAMLEASE_TABLE, _EVENTS_TABLE, _FLEET_TABLE.
TABLE_ARGUMENTS = {"table": STREAMS, "events_table": EVENTS, "fleet_table": FLEET}
TABLE_DEFINITIONS: dict[str, Callable[[str], dict[str, Any]]] = {
    STREAMS: schema.streams_table, EVENTS: schema.events_table, FLEET: schema.fleet_table}

# TableName expressions that are chosen at run time, by class: what they can name.
RUNTIME_TABLES: dict[tuple[str, str], tuple[str, ...]] = {
    # table create and the start-up check walk definitions(): every table.
    ("DynamoAdmin", "name"): ALL_TABLES,
    ("DynamoAdmin", "definition['TableName']"): ALL_TABLES,
    ("DynamoAdmin", "**definition"): ALL_TABLES,
    # a fenced write puts into the table its PutItem names.
    ("DynamoLeaderBackend", "write.table"): (CALLER,),
    # the change feed: the streams table's stream, and its checkpoints in the fleet table.
    ("ChangeFeedReader", "self.table"): (STREAMS,),
    ("DynamoFeedCheckpoints", "self.table"): (FLEET,),
}
# PutItem(...) built outside the store, by the top-level function that builds it and its
# table expression: which tables it names. `job write` hands its --table T (args.table) to
# jobcli._request, which builds the DynamoDB backend's PutItem.
SOURCE_PUT_TABLES = {("_request", "table"): JOB_WRITE}

TRANSACTION_KINDS = {
    "Update": "update_item",
    "Put": "put_item",
    "Delete": "delete_item",
    "ConditionCheck": "condition_check_item",
    "Get": "get_item",
}
TRANSACTION_OPERATIONS = {"transact_write_items", "transact_get_items"}
# Requests on several items of one or more tables, named by ``RequestItems``' keys.
BATCH_OPERATIONS = {"batch_get_item"}
# DynamoDB Streams: requests to a table's stream (IAM resource ``table/NAME/stream/*``).
STREAM_OPERATIONS = {"list_streams", "describe_stream", "get_shard_iterator", "get_records"}
# ... except ListStreams, for which IAM defines no resource type: it is authorised on "*".
UNSCOPED_OPERATIONS = {"list_streams"}

# The change feed's store classes: the reader of the streams table's stream and its
# checkpoints in the fleet table. The fleet leader builds them (not connect()), and only
# with STREAMLEASE_CHANGE_FEED on.
FEED_CLASSES = ("ChangeFeedReader", "DynamoFeedCheckpoints")
# A store's attribute holding another store -> that store's DynamoDB class:
# ``self.checkpoints.save(...)`` in the reader is DynamoFeedCheckpoints.save.
COLLABORATORS = {("ChangeFeedReader", "checkpoints"): "DynamoFeedCheckpoints"}
WRITE_ACTIONS = frozenset({"dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem",
                           "dynamodb:ConditionCheckItem"})

# Receiver names (the last name of ``self.leases``, ``stores.admin``, ``backend``) -> the
# field of ``Stores`` they hold.
ROLES = {"leases": "leases", "sink": "sink", "admin": "admin", "store": "admin",
         "fleet": "fleet", "jobs": "jobs", "leader": "leader", "backend": "leader",
         "checkpoints": "leases"}  # a processor output's checkpoint (processing.py)
# The Stores field that is the dynamodb sink (the events table): with any other
# STREAMLEASE_SINK the worker's sink is a ProcessorSink (app.worker_sink), so calls
# through this receiver reach no store.
EVENTS_SINK_ROLE = "sink"

# Words of DynamoDB's expression language that are not attribute names.
EXPRESSION_WORDS = frozenset(
    w.lower() for w in (
        "AND", "OR", "NOT", "BETWEEN", "IN", "SET", "REMOVE", "ADD", "DELETE",
        "attribute_exists", "attribute_not_exists", "attribute_type", "begins_with",
        "contains", "size", "if_not_exists", "list_append",
    )
)


class DiscoveryError(AssertionError):
    """Code in worker/ this reader cannot account for."""


@dataclass(frozen=True)
class Request:
    """One item or table action a method sends: its IAM action, on which table (and
    index), inside a transaction or not."""

    action: str  # dynamodb:UpdateItem, ...
    table: str  # streams, events, fleet, CALLER or JOB_WRITE
    index: str | None
    in_transaction: bool
    where: str  # path:line
    attributes: frozenset[str] | None = None  # UpdateItem: every attribute name it names
    partitions: frozenset[str] | None = None  # fleet-table writes: partition key patterns


@dataclass
class Method:
    cls: str
    name: str
    where: str
    requests: list[Request] = field(default_factory=list)
    helpers: set[str] = field(default_factory=set)  # self.<name>(...)
    delegates: set[tuple[str, str]] = field(default_factory=set)  # self.<store>.<name>(...)
    puts: list[Request] = field(default_factory=list)  # PutItem(...) it builds


@dataclass(frozen=True)
class Stores:
    """The store classes under streamlease/store/, and how ``connect`` wires them."""

    methods: dict[tuple[str, str], Method]  # (class, method) -> Method
    role_class: dict[str, str]  # Stores field -> DynamoDB class

    def of_role(self, role: str, name: str) -> Method | None:
        cls = self.role_class.get(role)
        return self.methods.get((cls, name)) if cls else None

    def public_methods(self) -> set[tuple[str, str]]:
        classes = set(self.role_class.values())
        return {(c, n) for c, n in self.methods if c in classes and not n.startswith("_")}


@dataclass(frozen=True)
class Usage:
    """How one set of requests uses one action on one resource."""

    transaction_only: bool  # never sent as a request of its own
    attributes: frozenset[str]  # UpdateItem: names its requests name
    partitions: frozenset[str] | None  # fleet writes: partition patterns (None: not read)


@dataclass(frozen=True)
class Needs:
    """What a set of store methods sends, closed over their helpers."""

    requests: tuple[Request, ...]

    @property
    def updates(self) -> tuple[Request, ...]:
        return tuple(r for r in self.requests if r.action == "dynamodb:UpdateItem")

    def updated_attributes(self, table: str) -> frozenset[str]:
        return frozenset().union(*(r.attributes or frozenset() for r in self.updates
                                   if r.table == table))

    def iam_actions(self) -> frozenset[str]:
        return frozenset(r.action for r in self.requests)

    def resources(self) -> dict[tuple[str, str | None], dict[str, Usage]]:
        """(table, index) -> action -> how it is used."""
        grouped: dict[tuple[str, str | None], dict[str, list[Request]]] = {}
        for r in self.requests:
            grouped.setdefault((r.table, r.index), {}).setdefault(r.action, []).append(r)
        out: dict[tuple[str, str | None], dict[str, Usage]] = {}
        for resource, actions in grouped.items():
            out[resource] = {}
            for action, requests in actions.items():
                partitions = [r.partitions for r in requests]
                out[resource][action] = Usage(
                    transaction_only=all(r.in_transaction for r in requests),
                    attributes=frozenset().union(*(r.attributes or frozenset()
                                                   for r in requests)),
                    partitions=None if any(p is None for p in partitions)
                    else frozenset().union(*(p for p in partitions if p is not None)),
                )
        return out


def iam_action(operation: str) -> str:
    return "dynamodb:" + "".join(w.title() for w in operation.split("_"))


# --- how connect() wires the stores -----------------------------------------------------------


def _function(tree: ast.AST, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            return node
    raise DiscoveryError(f"no function {name}")


def wiring(connect_path: Path = CONNECT) -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
    """(Stores field -> class, class -> the table argument of each constructor parameter
    position) from ``connect``'s ``Stores(...)``."""
    fn = _function(ast.parse(connect_path.read_text()), "connect")
    roles: dict[str, str] = {}
    arguments: dict[str, tuple[str, ...]] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id == "Stores":
            for kw in node.keywords:
                value = kw.value
                if not (kw.arg and isinstance(value, ast.Call)
                        and isinstance(value.func, ast.Name)):
                    raise DiscoveryError(f"{connect_path}: Stores({kw.arg}=...) is not a "
                                         "constructor call")
                roles[kw.arg] = value.func.id
                arguments[value.func.id] = tuple(
                    TABLE_ARGUMENTS.get(a.id, "") if isinstance(a, ast.Name) else ""
                    for a in value.args)
    if not roles:
        raise DiscoveryError(f"{connect_path}: connect() builds no Stores(...)")
    return roles, arguments


def _table_attributes(cls: ast.ClassDef, arguments: tuple[str, ...]) -> dict[str, str]:
    """``self.<attr> = <param>`` in ``__init__`` -> the table that parameter receives."""
    init = next((f for f in cls.body if isinstance(f, ast.FunctionDef)
                 and f.name == "__init__"), None)
    if init is None:
        return {}
    params = [a.arg for a in init.args.args[1:]]  # without self
    table_of_param = {p: t for p, t in zip(params, arguments, strict=False) if t}
    out = {}
    for node in ast.walk(init):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Attribute)
                and isinstance(node.targets[0].value, ast.Name)
                and node.targets[0].value.id == "self" and isinstance(node.value, ast.Name)
                and node.value.id in table_of_param):
            out[node.targets[0].attr] = table_of_param[node.value.id]
    return out


# --- reading streamlease/store/ ----------------------------------------------------------------


@functools.cache
def store_classes(store_dir: Path = STORE) -> Stores:
    """Every method of every class under ``store_dir``."""
    roles, arguments = wiring()
    methods: dict[tuple[str, str], Method] = {}
    for path in sorted(store_dir.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            tables = _table_attributes(cls, arguments.get(cls.name, ()))
            wired = cls.name in arguments
            for fn in cls.body:
                if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                    methods[(cls.name, fn.name)] = _read_method(path, cls.name, fn, tables,
                                                                wired)
    for role, cls_name in roles.items():
        if not any(c == cls_name for c, _ in methods):
            raise DiscoveryError(f"connect() wires {role} to {cls_name}, not found under "
                                 f"{store_dir}")
    return Stores(methods, roles)


def _where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"


class _Reader:
    """One method's requests, in the context of its class's table attributes."""

    def __init__(self, path: Path, cls: str, fn: ast.AST, tables: dict[str, str]) -> None:
        self.path, self.cls, self.tables = path, cls, tables
        self.builders = _builder_assignments(fn)
        self.dicts = _dict_bindings(fn)

    def where(self, node: ast.AST) -> str:
        return _where(self.path, node)

    def resolve_table(self, node: ast.AST, expr: ast.expr | None) -> tuple[str, ...]:
        if expr is None:
            raise DiscoveryError(f"{self.where(node)}: a request without a TableName")
        if (isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name)
                and expr.value.id == "self" and expr.attr in self.tables):
            return (self.tables[expr.attr],)
        text = ast.unparse(expr)
        if (self.cls, text) in RUNTIME_TABLES:
            return RUNTIME_TABLES[(self.cls, text)]
        raise DiscoveryError(f"{self.where(node)}: cannot tell which table TableName={text} "
                             f"names in {self.cls} (not an attribute its constructor sets "
                             "from connect()'s table arguments, nor in RUNTIME_TABLES)")

    def requests(self, node: ast.AST, operation: str, fields: dict[str, ast.expr],
                 in_transaction: bool) -> list[Request]:
        action = iam_action(operation)
        for key, value in list(fields.items()):
            if key.startswith("**") and isinstance(value, ast.Name) and value.id in self.dicts:
                del fields[key]  # **kwargs, bound to a dict literal here: its fields
                fields = {**_dict_fields(self.dicts[value.id]), **fields}
        table_expr = fields.get("TableName")
        splats = [v for k, v in fields.items() if k.startswith("**")]
        if table_expr is None and len(splats) == 1 and isinstance(splats[0], ast.Name):
            table_expr = ast.Name(id="**" + splats[0].id)  # **definition: a whole request
        if operation in BATCH_OPERATIONS:
            # A batch names its tables as the keys of RequestItems, a dict literal.
            request_items = fields.get("RequestItems")
            if not isinstance(request_items, ast.Dict) or None in request_items.keys:
                raise DiscoveryError(f"{self.where(node)}: {operation} without a dict literal "
                                     "RequestItems")
            return [Request(action, table, None, in_transaction, self.where(node))
                    for key in request_items.keys
                    for table in self.resolve_table(node, key)]
        if operation in STREAM_OPERATIONS:
            # DynamoDB Streams requests name a stream ARN or shard iterator, not a table:
            # the stream is its reader's table's (``RUNTIME_TABLES``).
            return [Request(action, table, None, in_transaction, self.where(node))
                    for table in self.resolve_table(node, ast.parse("self.table").body[0].value)]  # type: ignore[attr-defined]
        tables = self.resolve_table(node, table_expr)
        if operation == "update_table":
            # UpdateTable only adds a missing index: only a table with indexes lacks one.
            tables = tuple(t for t in tables if t not in TABLE_DEFINITIONS
                           or "GlobalSecondaryIndexes" in TABLE_DEFINITIONS[t]("x"))
        index = None
        if "IndexName" in fields:
            index = _string_value(self.where(node), fields["IndexName"])
        attributes = None
        if operation == "update_item":
            attributes = self.update_attributes(node, fields)
        out = []
        for table in tables:
            partitions = None
            if table == FLEET and action in WRITE_ACTIONS:
                item = fields.get("Key", fields.get("Item"))
                if item is None:
                    raise DiscoveryError(f"{self.where(node)}: a fleet-table write without "
                                         "Key or Item")
                partitions = key_patterns(self.where(node), item)
            out.append(Request(action, table, index, in_transaction, self.where(node),
                               attributes, partitions))
        return out

    def update_attributes(self, node: ast.AST, fields: dict[str, ast.expr]) -> frozenset[str]:
        where = self.where(node)
        names: set[str] = set()
        accounted = False
        for key, value in fields.items():
            if key == "ExpressionAttributeNames":
                names |= _literal_names(where, value)
                accounted = True
            elif key in ("UpdateExpression", "ConditionExpression"):
                if not (isinstance(value, ast.Constant) and isinstance(value.value, str)):
                    raise DiscoveryError(f"{where}: {key} is not a literal string")
                names |= bare_attribute_names(value.value)
            elif key.startswith("**"):  # **expr.update_kwargs()
                builder = _builder_of(value, self.builders)
                if builder is None:
                    raise DiscoveryError(f"{where}: cannot read **{ast.unparse(value)}")
                names |= builder_attributes(*builder)
                accounted = True
            elif key == "Key":
                names |= _key_names(where, value)
        if not accounted:
            raise DiscoveryError(f"{where}: cannot tell which attributes this UpdateItem "
                                 "names (no codec expression builder, no "
                                 "ExpressionAttributeNames)")
        return frozenset(names)

    def codec_transaction_items(self, call: ast.Call) -> list[Request]:
        """A codec function that returns a transaction item (``{"ConditionCheck": ...}``):
        called with placeholders, its table read back to the argument that named it."""
        found = _codec_call(call)
        assert found is not None
        module, name = found
        fn = getattr(CODECS[module], name, None)
        if fn is None or not callable(fn) or not _builds_transaction_item(fn):
            return []
        params = list(inspect.signature(fn).parameters)
        bound: dict[str, ast.expr] = dict(zip(params, call.args, strict=False))
        bound.update({kw.arg: kw.value for kw in call.keywords if kw.arg})
        out = []
        for args in _sample_arguments(fn):
            item = fn(**args)
            ((kind, body),) = item.items()
            table_param = _placeholder_param(body.get("TableName"))
            if kind not in TRANSACTION_KINDS or table_param not in bound:
                raise DiscoveryError(f"{self.where(call)}: {module}.{name} returns a "
                                     "transaction item whose table is not one of its "
                                     "arguments")
            action = iam_action(TRANSACTION_KINDS[kind])
            for table in self.resolve_table(call, bound[table_param]):
                partitions = frozenset({_pattern(body["Key"])}) \
                    if table == FLEET and "Key" in body else None
                attributes = None
                if kind == "Update":
                    attributes = frozenset(body.get("ExpressionAttributeNames", {}).values())
                out.append(Request(action, table, None, True, self.where(call), attributes,
                                   partitions))
        return list(dict.fromkeys(out))

    def put_description(self, call: ast.Call) -> Request:
        """``PutItem(table, item, ...)`` built for a caller to send (a fenced write)."""
        table_expr = call.args[0] if call.args else next(
            (kw.value for kw in call.keywords if kw.arg == "table"), None)
        item = call.args[1] if len(call.args) > 1 else next(
            (kw.value for kw in call.keywords if kw.arg == "item"), None)
        (table,) = self.resolve_table(call, table_expr)
        partitions = key_patterns(self.where(call), item) if table == FLEET and item else None
        return Request("dynamodb:PutItem", table, None, True, self.where(call), None,
                       partitions)


def _read_method(path: Path, cls: str, fn: ast.FunctionDef | ast.AsyncFunctionDef,
                 tables: dict[str, str], wired: bool) -> Method:
    method = Method(cls, fn.name, _where(path, fn))
    reader = _Reader(path, cls, fn, tables)
    for node in ast.walk(fn):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) \
                    and func.value.id == "self":
                if func.attr == "_call":
                    operation = _literal_operation(path, node)
                    if operation not in TRANSACTION_OPERATIONS:
                        method.requests += reader.requests(node, operation,
                                                           _call_fields(node), False)
                else:
                    method.helpers.add(func.attr)
            elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Attribute) \
                    and isinstance(func.value.value, ast.Name) and func.value.value.id == "self" \
                    and (cls, func.value.attr) in COLLABORATORS:
                method.delegates.add((COLLABORATORS[(cls, func.value.attr)], func.attr))
            elif _codec_call(node) is not None:
                method.requests += reader.codec_transaction_items(node)
            elif isinstance(func, ast.Name) and func.id == "PutItem" and wired:
                # (the in-memory twin builds them too, for a table of its own)
                method.puts.append(reader.put_description(node))
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value in TRANSACTION_KINDS:
                    body = value if isinstance(value, ast.Dict) else (
                        reader.dicts.get(value.id) if isinstance(value, ast.Name) else None)
                    if body is None:
                        raise DiscoveryError(
                            f"{_where(path, node)}: a transaction {key.value} that is not a "
                            "dict literal (in place, or bound to a name in this method)")
                    method.requests += reader.requests(
                        body, TRANSACTION_KINDS[str(key.value)], _dict_fields(body), True)
    return method


def _literal_operation(path: Path, call: ast.Call) -> str:
    if not call.args or not isinstance(call.args[0], ast.Constant) \
            or not isinstance(call.args[0].value, str):
        raise DiscoveryError(f"{_where(path, call)}: self._call needs a literal operation "
                             f"name: {ast.unparse(call)[:120]}")
    return call.args[0].value


def _call_fields(call: ast.Call) -> dict[str, ast.expr]:
    out: dict[str, ast.expr] = {}
    for i, kw in enumerate(call.keywords):
        out[kw.arg if kw.arg else f"**{i}"] = kw.value
    return out


def _dict_fields(node: ast.Dict) -> dict[str, ast.expr]:
    out: dict[str, ast.expr] = {}
    for i, (key, value) in enumerate(zip(node.keys, node.values, strict=True)):
        if key is None:
            out[f"**{i}"] = value
        elif isinstance(key, ast.Constant) and isinstance(key.value, str):
            out[key.value] = value
    return out


def _dict_bindings(fn: ast.AST) -> dict[str, ast.Dict]:
    """Local names bound to a dict literal: ``put = {...}`` or ``put: T = {...}``."""
    out: dict[str, ast.Dict] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Dict):
            out[node.targets[0].id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                and isinstance(node.value, ast.Dict):
            out[node.target.id] = node.value
    return out


def _builder_assignments(fn: ast.AST) -> dict[str, tuple[str, str]]:
    """Local names bound to a codec builder's result: ``expr = codec.f(...)``."""
    out: dict[str, tuple[str, str]] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name):
            builder = _codec_call(node.value)
            if builder is not None:
                out[node.targets[0].id] = builder
    return out


def _codec_call(node: ast.expr) -> tuple[str, str] | None:
    """``codec.f(...)`` or ``fleetcodec.f(...)``: (module, function)."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name) and node.func.value.id in CODECS):
        return node.func.value.id, node.func.attr
    return None


def _builder_of(value: ast.expr, builders: dict[str, tuple[str, str]]) -> tuple[str, str] | None:
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
            and node.value.id in CODECS):
        value = getattr(CODECS[node.value.id], node.attr)
        if isinstance(value, str):
            return value
    shown = ast.unparse(node) if node is not None else "None"
    raise DiscoveryError(f"{where}: attribute name {shown} is neither a string nor a "
                         "codec constant")


# --- the codecs, called with sample arguments -------------------------------------------------

PLACEHOLDER = re.compile(r"<([A-Za-z_][A-Za-z0-9_]*)>")
NUMBERED = re.compile(r"#[0-9]+$")


def bare_attribute_names(expression: str) -> set[str]:
    """Attribute names written without a ``#placeholder`` in an expression."""
    found = set()
    for word in re.findall(r"[#:]?[A-Za-z_][A-Za-z0-9_]*", expression):
        if word[0] not in "#:" and word.lower() not in EXPRESSION_WORDS:
            found.add(word)
    return found


@functools.cache
def builder_attributes(module: str, name: str) -> frozenset[str]:
    """Every attribute name one codec builder's expressions can name, over all branches."""
    fn = getattr(CODECS[module], name, None)
    if fn is None or not callable(fn):
        raise DiscoveryError(f"{module}.{name} is not a function")
    if typing.get_type_hints(fn).get("return") is not codec.Expr:
        raise DiscoveryError(f"{module}.{name} does not return an Expr")
    names: set[str] = set()
    for args in _sample_arguments(fn):
        expr = fn(**args)
        names |= set(expr.names.values())
        for text in (expr.condition, expr.update or ""):
            names |= bare_attribute_names(text)
    return frozenset(names)


def key_patterns(where: str, node: ast.expr) -> frozenset[str]:
    """The partition keys a ``Key=``/``Item=`` built by a codec function can hold, with
    each placeholder argument read back as ``*`` (``RUN#<job>`` -> ``RUN#*``, ``MEMBER#1``
    -> ``MEMBER#*``)."""
    found = _codec_call(node)
    if found is None:
        raise DiscoveryError(f"{where}: a fleet-table key or item not built by a codec "
                             f"function: {ast.unparse(node)[:80]}")
    module, name = found
    fn = getattr(CODECS[module], name)
    return frozenset(_pattern(fn(**args)) for args in _sample_arguments(fn))


def _pattern(item: dict[str, Any]) -> str:
    value = item.get(fleetcodec.PK, {})
    if not isinstance(value, dict) or not isinstance(value.get("S"), str):
        raise DiscoveryError(f"a fleet-table key without a string {fleetcodec.PK}: {item}")
    # A number sampled into a key's suffix (``MEMBER#<shard>``) stands for any number.
    return NUMBERED.sub("#*", PLACEHOLDER.sub("*", value["S"]))


def _placeholder_param(value: Any) -> str | None:
    match = PLACEHOLDER.fullmatch(value) if isinstance(value, str) else None
    return match[1] if match else None


def _builds_transaction_item(fn: Callable[..., Any]) -> bool:
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError):
        return False
    return any(isinstance(node, ast.Dict) and any(
        isinstance(k, ast.Constant) and k.value in TRANSACTION_KINDS for k in node.keys)
        for node in ast.walk(tree))


def _sample_arguments(fn: Callable[..., Any]) -> Iterator[dict[str, Any]]:
    hints = typing.get_type_hints(fn)
    params = list(inspect.signature(fn).parameters.values())
    where = f"{fn.__module__}.{fn.__name__}"
    choices = [_samples(hints[p.name], f"{where}({p.name})", p.name) for p in params]
    combos = list(itertools.product(*choices))
    if len(combos) > 256:
        raise DiscoveryError(f"{where}: too many argument combinations to try")
    for combo in combos:
        yield {p.name: value for p, value in zip(params, combo, strict=True)}


def _samples(hint: Any, where: str, name: str) -> list[Any]:
    """Values to try for one parameter: a placeholder string, both ends of a number, every
    member of an enum, dataclasses built from their fields' samples."""
    if hint is str:
        return [f"<{name}>"]
    if hint is bool:
        return [False, True]
    if hint is int:
        return [0, 1]
    if hint is float:
        return [0.0, 1.0]
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return list(hint)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _dataclass_samples(hint, where)
    origin = typing.get_origin(hint)
    if origin in (list, tuple, collections.abc.Iterable, collections.abc.Sequence):
        # One element: the expression a collection argument builds is the same shape.
        return [[value] for value in _samples(typing.get_args(hint)[0], where, name)]
    if origin in (set, frozenset):
        return [frozenset()]
    if origin in (typing.Union, types.UnionType):
        out: list[Any] = []
        for member in typing.get_args(hint):
            out.extend([None] if member is type(None) else _samples(member, where, name))
        return out
    raise DiscoveryError(f"{where}: no sample values for {hint!r}")


def _dataclass_samples(cls: type, where: str) -> list[Any]:
    """Every combination of the fields' samples when there are few (at most 64), else the
    first and the last sample of every field; those the class accepts."""
    hints = typing.get_type_hints(cls)
    fields = [f for f in dataclasses.fields(cls) if f.init]
    choices = [_samples(hints[f.name], f"{where}.{f.name}", f.name) for f in fields]
    combos: Iterable[tuple[Any, ...]] = itertools.product(*choices)
    if len(list(itertools.product(*choices))) > 64:
        combos = [tuple(c[0] for c in choices), tuple(c[-1] for c in choices)]
    built = []
    for combo in combos:
        try:
            built.append(cls(**{f.name: v for f, v in zip(fields, combo, strict=True)}))
        except (ValueError, TypeError):
            continue
    if not built:
        raise DiscoveryError(f"{where}: no sample of {cls.__name__} could be built")
    return built


# --- who calls what -------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """A file of code that calls stores: whole, or only (or all but) some of its top-level
    functions."""

    path: Path
    only: frozenset[str] | None = None
    skip: frozenset[str] = frozenset()

    def nodes(self) -> list[ast.AST]:
        tree = ast.parse(self.path.read_text(), str(self.path))
        chosen = []
        names = set()
        for node in tree.body:
            name = getattr(node, "name", None)
            names.add(name)
            if (self.only is None or name in self.only) and name not in self.skip:
                chosen.append(node)
        unknown = ((self.only or frozenset()) | self.skip) - names
        if unknown:
            raise DiscoveryError(f"{self.path}: no top-level {sorted(unknown)}")
        return chosen


def _receiver_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def calls_in(sources: Iterable[Source], stores: Stores | None = None,
             skip_roles: frozenset[str] = frozenset()
             ) -> tuple[set[tuple[str, str]], list[Request]]:
    """(class, method) of every store method these sources call, through a receiver
    named after its store (ROLES) other than ``skip_roles``, every public method of a
    change-feed store class they build (``FEED_CLASSES``), and the PutItem writes they
    build themselves."""
    stores = store_classes() if stores is None else stores
    called: set[tuple[str, str]] = set()
    puts: list[Request] = []
    for source in sources:
        for top in source.nodes():
            for node in ast.walk(top):
                if not isinstance(node, ast.Call):
                    continue
                func = node.func
                built_class = _receiver_name(func)
                if built_class in FEED_CLASSES:
                    called |= {(c, n) for c, n in stores.methods
                               if c == built_class and not n.startswith("_")}
                elif isinstance(func, ast.Attribute):
                    method = _store_method(stores, func, skip_roles)
                    if method is not None:
                        called.add((method.cls, method.name))
                elif isinstance(func, ast.Name) and func.id == "PutItem":
                    table = ast.unparse(node.args[0]) if node.args else ""
                    key = (str(getattr(top, "name", "")), table)
                    if key not in SOURCE_PUT_TABLES:
                        raise DiscoveryError(f"{_where(source.path, node)}: a PutItem into "
                                             f"{table or '?'}: which tables can that be?")
                    puts.append(Request("dynamodb:PutItem", SOURCE_PUT_TABLES[key], None,
                                        True, _where(source.path, node)))
                # A store method handed over for another function to call
                # (retried_at_start(admin.check_tables, ...)) is called too.
                for arg in [*node.args, *(k.value for k in node.keywords)]:
                    method = _store_method(stores, arg, skip_roles) \
                        if isinstance(arg, ast.Attribute) else None
                    if method is not None:
                        called.add((method.cls, method.name))
    return called, puts


def _store_method(stores: Stores, attribute: ast.Attribute, skip_roles: frozenset[str]
                  ) -> Method | None:
    """The store method ``receiver.name`` names, through a receiver named after its store
    (ROLES) other than ``skip_roles``; None for anything else."""
    role = ROLES.get(_receiver_name(attribute.value) or "")
    if not role or role in skip_roles:
        return None
    return stores.of_role(role, attribute.attr)


def reachable(called: Iterable[tuple[str, str]], stores: Stores | None = None
              ) -> set[tuple[str, str]]:
    """These store methods, every helper of their class they reach and every method of a
    collaborating store (``COLLABORATORS``) they call."""
    stores = store_classes() if stores is None else stores
    seen: set[tuple[str, str]] = set()
    queue = list(called)
    while queue:
        key = queue.pop()
        if key in seen or key not in stores.methods:
            continue
        seen.add(key)
        method = stores.methods[key]
        for delegate in method.delegates:
            if delegate not in stores.methods:
                raise DiscoveryError(f"{method.where}: calls {delegate[0]}.{delegate[1]}, "
                                     "which is not a method of that class")
        queue += [(method.cls, helper) for helper in method.helpers]
        queue += list(method.delegates)
    return seen


def feed_methods(stores: Stores | None = None) -> set[tuple[str, str]]:
    """Every public method of the change feed's store classes (``FEED_CLASSES``)."""
    stores = store_classes() if stores is None else stores
    found = {(c, n) for c, n in stores.methods if c in FEED_CLASSES and not n.startswith("_")}
    missing = set(FEED_CLASSES) - {c for c, _ in found}
    if missing:
        raise DiscoveryError(f"no change-feed store class {sorted(missing)} under {STORE}")
    return found


def needs(called: Iterable[tuple[str, str]], puts: Iterable[Request] = (),
          stores: Stores | None = None) -> Needs:
    """What these store methods send, with every helper of their class and every
    collaborating store's method they reach. A write to the caller's table becomes one
    write per PutItem built by the methods reached or given in ``puts``."""
    stores = store_classes() if stores is None else stores
    requests: list[Request] = []
    built = list(puts)
    for key in sorted(reachable(called, stores)):
        method = stores.methods[key]
        requests += method.requests
        built += method.puts
    out: list[Request] = []
    for request in requests:
        if request.table != CALLER:
            out.append(request)
            continue
        if not built:
            raise DiscoveryError(f"{request.where}: a write into the caller's table, and no "
                                 "PutItem built by the code that reaches it")
        out += [dataclasses.replace(request, table=p.table, partitions=p.partitions)
                for p in built]
    return Needs(tuple(dict.fromkeys(out)))


JOB_WRITE_FUNCTIONS = frozenset({"write", "_request"})  # jobcli.py: `job write`


def worker_run_files() -> list[Path]:
    """The code ``streamlease run`` executes outside the store: not the commands, not
    dev/."""
    return sorted(p for p in WORKER.rglob("*.py")
                  if p.name not in ("cli.py", "jobcli.py")
                  and not {"dev", "store"} & set(p.relative_to(WORKER).parts))


def task_sources() -> list[Source]:
    """What runs with the task role: ``streamlease run``, and ``streamlease job write``
    (``write`` and the request it builds, ``_request``), which jobs (the worker's
    subprocesses) call."""
    return [Source(p) for p in worker_run_files()] + [
        Source(WORKER / "jobcli.py", only=JOB_WRITE_FUNCTIONS)]


def operator_sources() -> list[Source]:
    """The code behind ``streamlease table create``, ``ctl`` and ``job put|list|remove|
    runs`` (not ``job write``: that runs inside jobs, with the task role)."""
    return [Source(WORKER / "cli.py"),
            Source(WORKER / "jobcli.py", skip=JOB_WRITE_FUNCTIONS)]
