"""What each kind of sink output calls with the task role, read from streamlease/sinks/
without running it, and the grants the module owes each kind.

``KIND_ACTIONS`` is the table the module's policy follows (terraform/modules/streamlease/
sinks.tf ``local.sink_kind_actions``); the tests check it three ways: against the code
(``aws_actions``: the AWS client calls of the module ``open_output`` imports for a kind,
each operation found in botocore's model of that kind's service and named by its IAM
action), against sinks.tf's table, and against the planned policy of runs with each kind.

The forms this reader relies on (anything else raises ``DiscoveryError``):
- ``streamlease/sinks/__init__.py`` ``open_output`` maps kinds to modules with a dict
  literal (``{"postgres": "postgres", "kinesis": "aws", ...}``), and opens ``file`` and
  ``stdout`` through ``streamlease.sinks.files``;
- an AWS output calls its service through a receiver named ``client`` (``client.x(...)``,
  ``self.client.x(...)``), made by ``session.client(spec.kind, ...)``: the service is the
  sink's kind;
- an output that is not an AWS service imports no AWS SDK (``AWS_SDKS``), so that a
  ``client`` of its own (pymongo's, say) cannot be an AWS client.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import botocore.session
from botocore import xform_name

from streamlease.core.sinks import KINDS

ROOT = Path(__file__).resolve().parents[2]
SINKS = ROOT / "streamlease" / "sinks"

# Kind -> the IAM actions its output sends with the task role (not dynamodb: the events
# table's grants come from store_calls; not python: the user's processor is the
# operator's to grant, through extra_task_policy_json).
KIND_ACTIONS: dict[str, frozenset[str]] = {
    "dynamodb": frozenset(),
    "postgres": frozenset(),
    "mongodb": frozenset(),
    "http": frozenset(),
    "file": frozenset(),
    "stdout": frozenset(),
    "python": frozenset(),
    "kinesis": frozenset({"kinesis:PutRecords"}),
    "sqs": frozenset({"sqs:GetQueueUrl", "sqs:SendMessage"}),
    "s3": frozenset({"s3:PutObject"}),
}
AWS_KINDS = tuple(k for k, actions in KIND_ACTIONS.items() if actions)
# Operations IAM authorises under another action's name (SQS's batch forms have no
# actions of their own: the IAM reference lists SendMessageBatch under sqs:SendMessage).
AUTHORISED_AS = {
    "sqs:SendMessageBatch": "sqs:SendMessage",
    "sqs:DeleteMessageBatch": "sqs:DeleteMessage",
    "sqs:ChangeMessageVisibilityBatch": "sqs:ChangeMessageVisibility",
}
# The packages an output needs to call an AWS API.
AWS_SDKS = frozenset({"aioboto3", "aiobotocore", "boto3", "botocore"})
# What the modules import for the kinds open_output does not list in its dict.
FIXED_MODULES = {"file": "files", "stdout": "files"}


class DiscoveryError(AssertionError):
    """Code in streamlease/sinks/ this reader cannot account for."""


def assert_table_covers_every_kind() -> None:
    if set(KIND_ACTIONS) != set(KINDS):
        raise DiscoveryError(f"KIND_ACTIONS names {sorted(KIND_ACTIONS)}, "
                             f"streamlease.core.sinks.KINDS is {sorted(KINDS)}")


def output_modules(init: Path = SINKS / "__init__.py") -> dict[str, str]:
    """Kind -> the module under streamlease/sinks/ that open_output imports for it."""
    tree = ast.parse(init.read_text(), str(init))
    fn = next((n for n in ast.walk(tree) if isinstance(n, ast.AsyncFunctionDef | ast.FunctionDef)
               and n.name == "open_output"), None)
    if fn is None:
        raise DiscoveryError(f"{init}: no open_output")
    found: dict[str, str] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Dict) and node.keys and all(
                isinstance(k, ast.Constant) and k.value in KINDS for k in node.keys):
            for k, v in zip(node.keys, node.values, strict=True):
                if not (isinstance(v, ast.Constant) and isinstance(v.value, str)):
                    raise DiscoveryError(f"{init}: open_output maps {ast.unparse(k)} to "
                                         f"{ast.unparse(v)}, not a module name")
                assert isinstance(k, ast.Constant)
                found[str(k.value)] = v.value
    if not found:
        raise DiscoveryError(f"{init}: open_output has no kind -> module dict")
    if "from streamlease.sinks import files" not in init.read_text():
        raise DiscoveryError(f"{init}: file and stdout no longer open streamlease.sinks.files")
    return {**FIXED_MODULES, **found}


def client_calls(path: Path) -> set[str]:
    """Method names called on a receiver named ``client`` in one module."""
    tree = ast.parse(path.read_text(), str(path))
    calls = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            receiver = node.func.value
            name = receiver.id if isinstance(receiver, ast.Name) else \
                receiver.attr if isinstance(receiver, ast.Attribute) else None
            if name == "client":
                calls.add(node.func.attr)
    return calls


def aws_sdk_imports(path: Path) -> set[str]:
    """The AWS SDK packages (``AWS_SDKS``) one module imports, at any depth."""
    tree = ast.parse(path.read_text(), str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found & AWS_SDKS


@functools.cache
def _operations(service: str) -> dict[str, str]:
    """botocore method name -> operation name, from the bundled model (no network)."""
    model = botocore.session.get_session().get_service_model(service)
    return {xform_name(op): op for op in model.operation_names}


def iam_action(service: str, operation: str) -> str:
    action = f"{service}:{operation}"
    return AUTHORISED_AS.get(action, action)


def aws_actions(path: Path) -> dict[str, frozenset[str]]:
    """AWS kind -> the IAM actions its calls in ``path`` need. A client call that is an
    operation of none of the AWS kinds' services (or of several) is an error: the table
    could not say which kind makes it."""
    out: dict[str, set[str]] = {k: set() for k in AWS_KINDS}
    for method in sorted(client_calls(path)):
        if method in ("close", "__aenter__", "__aexit__"):
            continue
        owners = [k for k in AWS_KINDS if method in _operations(k)]
        if len(owners) != 1:
            raise DiscoveryError(f"{path.relative_to(ROOT)}: client.{method}() is an "
                                 f"operation of {owners or 'no'} sink service(s)")
        (kind,) = owners
        out[kind].add(iam_action(kind, _operations(kind)[method]))
    return {k: frozenset(v) for k, v in out.items()}


def module_path(kind: str) -> Path | None:
    """The file of the module open_output uses for ``kind``, if this tree has it."""
    name = output_modules().get(kind)
    if name is None:
        return None
    path = SINKS / f"{name}.py"
    return path if path.exists() else None
