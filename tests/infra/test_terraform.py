"""The terraform in terraform/ against the code: table schema, IAM, worker settings,
the ECS task definition and service, the security group. Offline: python-hcl2 parses
every file, tests/infra/hcl.py evaluates the expressions that matter."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest

from tests.infra.hcl import (
    EXAMPLE_DIR,
    MODULE_DIR,
    ROOT,
    TERRAFORM,
    Module,
    Scope,
    Unknown,
    blocks,
    condition_holds,
    dynamic_blocks,
    evaluate,
    load_module,
    parse_file,
    preconditions,
    tf_files,
    validation_errors,
)
from worker.config import DEFAULTS, SETTINGS, WorkerConfig
from worker.errors import ConfigError
from worker.store import codec, schema

WORKER = ROOT / "worker"
STORE = WORKER / "store" / "dynamodb.py"

# The module's required inputs, for evaluating it.
REQUIRED = {
    "image": "123456789012.dkr.ecr.eu-west-1.amazonaws.com/streamlease:0.1.0",
    "vpc_id": "vpc-0123456789abcdef0",
    "subnet_ids": ["subnet-0123456789abcdef0"],
}

STREAMS_ARN = "${aws_dynamodb_table.streams.arn}"
EVENTS_ARN = "${aws_dynamodb_table.events.arn}"
INDEX_ARN = f"{STREAMS_ARN}/index/{codec.INDEX_NAME}"


@pytest.fixture(scope="module")
def module() -> Module:
    return load_module(MODULE_DIR)


@pytest.fixture(scope="module")
def example() -> Module:
    return load_module(EXAMPLE_DIR)


def scope(module: Module, **overrides: Any) -> Scope:
    return module.scope(**{**REQUIRED, **overrides})


# --- files, layout ----------------------------------------------------------------------


def test_every_tf_file_parses() -> None:
    files = tf_files(TERRAFORM)
    assert len(files) >= 8, files
    for path in files:
        parse_file(path)  # raises on a syntax error (checkov would not)


def test_module_and_example_pin_terraform_and_provider(module: Module, example: Module) -> None:
    for mod in (module, example):
        (settings,) = mod.terraform
        assert re.fullmatch(r">= ?1\.(5|[6-9]|1\d)\.\d+", evaluate(settings["required_version"],
                                                                    Scope(mod, {})))
        (providers,) = blocks(settings, "required_providers")
        aws = evaluate(providers["aws"], Scope(mod, {}))
        assert aws == {"source": "hashicorp/aws", "version": "~> 5.0"}
    (call,) = example.module_calls.values()
    source = evaluate(call["source"], Scope(example, {}))
    assert (EXAMPLE_DIR / source).resolve() == MODULE_DIR.resolve()


def test_example_passes_only_inputs_the_module_has(module: Module, example: Module) -> None:
    (call,) = example.module_calls.values()
    passed = set(call) - {"source"}
    assert passed <= set(module.variables), passed - set(module.variables)
    required = {n for n, v in module.variables.items() if "default" not in v}
    assert required <= passed, required - passed


def test_every_variable_is_typed_described_and_validated(module: Module) -> None:
    no_validation_ok = {"tags", "deletion_protection"}  # a map of strings, a bool
    for name, block in module.variables.items():
        assert "type" in block, name
        assert evaluate(block.get("description", '""'), Scope(module, {})), name
        if name not in no_validation_ok:
            assert blocks(block, "validation"), f"variable {name} has no validation"


def test_readme_tables_list_every_input_and_output(module: Module) -> None:
    readme = (TERRAFORM / "README.md").read_text()
    for name in module.variables:
        assert re.search(rf"^\| `{name}` \|", readme, re.M), f"input {name} missing from README"
    for name in module.outputs:
        assert re.search(rf"^\| `{name}` \|", readme, re.M), f"output {name} missing from README"


# --- tables -----------------------------------------------------------------------------------


def table_as_api(module: Module, name: str) -> dict[str, Any]:
    """The aws_dynamodb_table resource in the shape of CreateTable's arguments."""
    body = module.resource("aws_dynamodb_table", name)
    sc = scope(module)

    def val(key: str, where: dict[str, Any] = body) -> Any:
        return evaluate(where[key], sc)

    keys = [{"AttributeName": val("hash_key"), "KeyType": "HASH"}]
    if "range_key" in body:
        keys.append({"AttributeName": val("range_key"), "KeyType": "RANGE"})
    out: dict[str, Any] = {
        "TableName": val("name"),
        "BillingMode": val("billing_mode"),
        "AttributeDefinitions": [
            {"AttributeName": val("name", a), "AttributeType": val("type", a)}
            for a in blocks(body, "attribute")
        ],
        "KeySchema": keys,
    }
    indexes = []
    for gsi in blocks(body, "global_secondary_index"):
        index_keys = [{"AttributeName": val("hash_key", gsi), "KeyType": "HASH"}]
        if "range_key" in gsi:
            index_keys.append({"AttributeName": val("range_key", gsi), "KeyType": "RANGE"})
        indexes.append({"IndexName": val("name", gsi), "KeySchema": index_keys,
                        "Projection": {"ProjectionType": val("projection_type", gsi)}})
    if indexes:
        out["GlobalSecondaryIndexes"] = indexes
    return out


def normalised(definition: dict[str, Any]) -> dict[str, Any]:
    return {**definition, "AttributeDefinitions": sorted(
        definition["AttributeDefinitions"], key=lambda a: a["AttributeName"])}


def test_streams_table_is_the_contract(module: Module) -> None:
    expected = schema.streams_table(DEFAULTS["STREAMLEASE_TABLE"])
    assert normalised(table_as_api(module, "streams")) == normalised(expected)
    assert scope(module).local("streams_index_name") == codec.INDEX_NAME


def test_events_table_is_the_sink_schema(module: Module) -> None:
    expected = schema.events_table(DEFAULTS["STREAMLEASE_EVENTS_TABLE"])
    assert normalised(table_as_api(module, "events")) == normalised(expected)
    assert (codec.EV_PK, codec.EV_SK) == ("Pk", "Sk")


@pytest.mark.parametrize("name", ["streams", "events"])
def test_tables_are_protected_backed_up_and_encrypted(module: Module, name: str) -> None:
    body = module.resource("aws_dynamodb_table", name)
    sc = scope(module)
    (pitr,) = blocks(body, "point_in_time_recovery")
    assert evaluate(pitr["enabled"], sc) is True
    (sse,) = blocks(body, "server_side_encryption")
    assert evaluate(sse["enabled"], sc) is True
    assert sse["kms_key_arn"] == "${var.dynamodb_kms_key_arn}"
    assert evaluate(sse["kms_key_arn"], scope(module, dynamodb_kms_key_arn="arn:aws:kms:k")) \
        == "arn:aws:kms:k"
    assert evaluate(body["deletion_protection_enabled"], sc) is True


# --- IAM --------------------------------------------------------------------------------------


def policy(module: Module, name: str, **overrides: Any) -> dict[str, set[str]]:
    """{resource: actions} of one aws_iam_policy_document (static and dynamic statements)."""
    body = module.data[("aws_iam_policy_document", name)]
    sc = scope(module, **overrides)
    statements = [(s, sc) for s in blocks(body, "statement")]
    for dyn in dynamic_blocks(body, "statement"):
        for item in evaluate(dyn["for_each"], sc):
            statements.extend(
                (c, sc.with_names(statement={"value": item})) for c in blocks(dyn, "content"))
    grants: dict[str, set[str]] = {}
    for statement, ssc in statements:
        assert evaluate(statement.get("effect", '"Allow"'), ssc) == "Allow"
        assert "not_actions" not in statement and "not_resources" not in statement
        actions = evaluate(statement["actions"], ssc)
        for resource in evaluate(statement["resources"], ssc):
            grants.setdefault(str(resource), set()).update(actions)
    return grants


def store_operations() -> dict[str, set[str]]:
    """DynamoStore method -> DynamoDB operations it calls, directly or via its helpers."""
    tree = ast.parse(STORE.read_text())
    (cls,) = (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DynamoStore")
    direct: dict[str, set[str]] = {}
    helpers: dict[str, set[str]] = {}
    for fn in cls.body:
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        direct[fn.name], helpers[fn.name] = set(), set()
        for node in ast.walk(fn):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "self"):
                continue
            if node.func.attr == "_call":
                first = node.args[0]
                assert isinstance(first, ast.Constant), ast.unparse(node)
                direct[fn.name].add(str(first.value))
            else:
                helpers[fn.name].add(node.func.attr)
    ops = {name: set(found) for name, found in direct.items()}
    changed = True
    while changed:
        changed = False
        for name, called in helpers.items():
            for helper in called & set(ops):
                if not ops[helper] <= ops[name]:
                    ops[name] |= ops[helper]
                    changed = True
    return ops


def transaction_item_actions() -> set[str]:
    """IAM actions of the action kinds inside write_batch's TransactWriteItems."""
    tree = ast.parse(STORE.read_text())
    kinds = {"Update": "dynamodb:UpdateItem", "Put": "dynamodb:PutItem",
             "Delete": "dynamodb:DeleteItem", "ConditionCheck": "dynamodb:ConditionCheckItem"}
    (fn,) = (n for n in ast.walk(tree)
             if isinstance(n, ast.AsyncFunctionDef) and n.name == "write_batch")
    found = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Dict):
            for key in node.keys:
                if isinstance(key, ast.Constant) and key.value in kinds:
                    found.add(kinds[key.value])
    return found


def iam_actions(operations: set[str]) -> set[str]:
    out = set()
    for op in operations:
        if op == "transact_write_items":
            out |= transaction_item_actions()  # IAM has no TransactWriteItems action
        else:
            out.add("dynamodb:" + "".join(w.title() for w in op.split("_")))
    return out


def methods_called(files: list[Path]) -> set[str]:
    """DynamoStore methods called on a store/sink object in these files."""
    names = set(store_operations())
    found = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in names
                    and re.search(r"(store|sink)$", ast.unparse(node.func.value))):
                found.add(node.func.attr)
    return found


def worker_run_files() -> list[Path]:
    return [p for p in WORKER.rglob("*.py")
            if p.name != "cli.py" and not {"dev", "store"} & set(p.relative_to(WORKER).parts)]


def test_store_operations_are_the_known_set() -> None:
    """A new DynamoDB call in the store must come with an IAM review (and this list)."""
    ops = set().union(*store_operations().values())
    assert ops == {"create_table", "describe_table", "get_item", "query", "scan",
                   "transact_write_items", "update_item"}
    assert transaction_item_actions() == {"dynamodb:UpdateItem", "dynamodb:PutItem"}


def test_task_role_grants_exactly_what_the_worker_calls(module: Module) -> None:
    grants = policy(module, "task")
    assert grants == {
        # check_tables; acquire/renew/release/adopt/record_error + the sink's checkpoint
        # Update; the sweep (unindexed) that finds items without lease fields or with a
        # bad desired_state, which the sparse index cannot show.
        STREAMS_ARN: {"dynamodb:DescribeTable", "dynamodb:UpdateItem", "dynamodb:Scan"},
        INDEX_ARN: {"dynamodb:Query"},  # orphans: the sparse index only
        EVENTS_ARN: {"dynamodb:DescribeTable", "dynamodb:PutItem"},  # check_tables; sink Puts
    }
    # ... and that set is what the code the worker runs calls.
    ops = store_operations()
    used = methods_called(worker_run_files())
    assert {"acquire", "renew", "release", "orphans", "adopt", "write_batch",
            "check_tables"} <= used
    assert iam_actions(set().union(*(ops[m] for m in used))) == set().union(*grants.values())


def test_task_role_has_no_wildcards_and_is_the_task_definitions(module: Module) -> None:
    for mod_policy in ("task", "operator"):
        for resource, actions in policy(module, mod_policy).items():
            assert "*" not in resource and all("*" not in a for a in actions), resource
    attached = module.resource("aws_iam_role_policy", "task")
    assert attached["role"] == "${aws_iam_role.task.id}"
    assert attached["policy"] == "${data.aws_iam_policy_document.task.json}"
    td = module.resource("aws_ecs_task_definition", "worker")
    assert td["task_role_arn"] == "${aws_iam_role.task.arn}"
    assert td["execution_role_arn"] == "${aws_iam_role.execution.arn}"


def test_operator_policy_covers_ctl_and_table_create(module: Module) -> None:
    grants = policy(module, "operator")
    assert grants == {
        STREAMS_ARN: {"dynamodb:CreateTable", "dynamodb:DescribeTable", "dynamodb:GetItem",
                      "dynamodb:Scan", "dynamodb:UpdateItem"},
        EVENTS_ARN: {"dynamodb:CreateTable", "dynamodb:DescribeTable", "dynamodb:Query"},
    }
    ops = store_operations()
    used = methods_called([WORKER / "cli.py"])
    assert iam_actions(set().union(*(ops[m] for m in used))) == set().union(*grants.values())
    assert module.outputs["operator_policy_json"]["value"] == \
        "${data.aws_iam_policy_document.operator.json}"
    # Nothing in the module attaches it: it is for people, not for the tasks.
    for body in module.resources.values():
        assert "data.aws_iam_policy_document.operator" not in str(body)


def test_execution_role_pulls_only_its_image_and_writes_only_its_logs(module: Module) -> None:
    logs = "${aws_cloudwatch_log_group.worker.arn}:*"
    repo = "arn:${data.aws_partition.current.partition}:ecr:eu-west-1:123456789012:" \
           "repository/streamlease"
    assert policy(module, "execution") == {
        logs: {"logs:CreateLogStream", "logs:PutLogEvents"},
        repo: {"ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"},
        # GetAuthorizationToken has no resource-level permission.
        "*": {"ecr:GetAuthorizationToken"},
    }
    assert policy(module, "execution", image="ghcr.io/acme/streamlease:1.0") == {
        logs: {"logs:CreateLogStream", "logs:PutLogEvents"}}


def test_roles_trust_only_ecs_tasks_of_this_account(module: Module) -> None:
    body = module.data[("aws_iam_policy_document", "ecs_tasks_assume")]
    (statement,) = blocks(body, "statement")
    sc = scope(module)
    (principal,) = blocks(statement, "principals")
    assert evaluate(principal["identifiers"], sc) == ["ecs-tasks.amazonaws.com"]
    conditions = {evaluate(c["variable"], sc) for c in blocks(statement, "condition")}
    assert conditions == {"aws:SourceAccount", "aws:SourceArn"}


# --- worker settings --------------------------------------------------------------------------

# Contract setting -> module variable.
VARIABLE_OF = {
    "STREAMLEASE_TABLE": "table_name",
    "STREAMLEASE_EVENTS_TABLE": "events_table_name",
    "STREAMLEASE_LEASE_SECONDS": "lease_seconds",
    "STREAMLEASE_HEARTBEAT_SECONDS": "heartbeat_seconds",
    "STREAMLEASE_RECONCILE_SECONDS": "reconcile_seconds",
    "STREAMLEASE_MAX_STREAMS": "max_streams",
    "STREAMLEASE_SHUTDOWN_SECONDS": "shutdown_seconds",
    "STREAMLEASE_METRICS_PORT": "metrics_port",
    "STREAMLEASE_ALLOWED_URLS": "allowed_urls",
    "STREAMLEASE_LOG_FORMAT": "log_format",
    "STREAMLEASE_SKEW_MARGIN_SECONDS": "skew_margin_seconds",
    "STREAMLEASE_SAFETY_MARGIN_SECONDS": "safety_margin_seconds",
    "STREAMLEASE_SWEEP_SECONDS": "sweep_seconds",
    "STREAMLEASE_ACQUIRE_PER_CYCLE": "acquire_per_cycle",
    "STREAMLEASE_BATCH_MAX_MESSAGES": "batch_max_messages",
    "STREAMLEASE_BATCH_MAX_SECONDS": "batch_max_seconds",
    "STREAMLEASE_MAX_FRAME_BYTES": "max_frame_bytes",
    "STREAMLEASE_LOG_LEVEL": "log_level",
}


def as_env_value(value: Any) -> str:
    """What the module writes into the environment for a variable value."""
    if isinstance(value, list):
        return ",".join(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def test_every_worker_setting_is_a_variable_with_the_workers_default(module: Module) -> None:
    assert set(VARIABLE_OF) == {s.name for s in SETTINGS} - {"STREAMLEASE_WORKER_ID"}
    defaults = module.defaults()
    for setting, variable in VARIABLE_OF.items():
        assert variable in module.variables, setting
        description = evaluate(module.variables[variable]["description"], Scope(module, {}))
        assert description.startswith(f"{setting}:"), variable
        default = defaults[variable]
        if DEFAULTS[setting] == "":
            assert default is None, variable  # unset: the worker computes it
        else:
            assert as_env_value(default) == DEFAULTS[setting], variable
    assert not any("WORKER_ID" in v for v in module.variables)


def rendered_environment(module: Module, **overrides: Any) -> dict[str, Any]:
    td = module.resource("aws_ecs_task_definition", "worker")
    (container,) = evaluate(td["container_definitions"], scope(module, **overrides))
    env = {e["name"]: e["value"] for e in container["environment"]}
    assert len(env) == len(container["environment"])
    return env


def test_task_environment_carries_every_setting(module: Module) -> None:
    env = rendered_environment(module)
    assert env.pop("AWS_REGION") == Unknown("data.aws_region.current.name")
    assert env["STREAMLEASE_TABLE"] == Unknown("aws_dynamodb_table.streams.name")
    assert env["STREAMLEASE_EVENTS_TABLE"] == Unknown("aws_dynamodb_table.events.name")
    assert "STREAMLEASE_WORKER_ID" not in env  # the ECS task id, so never shared
    assert "STREAMLEASE_SAFETY_MARGIN_SECONDS" not in env  # unset: lease / 10
    assert set(env) == set(VARIABLE_OF) - {"STREAMLEASE_SAFETY_MARGIN_SECONDS"}
    # With the tables' names in place, the worker reads the defaults back.
    env.update(STREAMLEASE_TABLE="streamlease-streams",
               STREAMLEASE_EVENTS_TABLE="streamlease-events")
    assert WorkerConfig.from_env(env) == WorkerConfig.from_env({})
    custom = rendered_environment(module, lease_seconds=9, heartbeat_seconds=2.5,
                                  safety_margin_seconds=1.5,
                                  allowed_urls=["wss://a.example/", "ws://b.example/"])
    assert custom["STREAMLEASE_LEASE_SECONDS"] == "9"
    assert custom["STREAMLEASE_HEARTBEAT_SECONDS"] == "2.5"
    assert custom["STREAMLEASE_SAFETY_MARGIN_SECONDS"] == "1.5"
    assert custom["STREAMLEASE_ALLOWED_URLS"] == "wss://a.example/,ws://b.example/"


def worker_preconditions(module: Module) -> list[dict[str, Any]]:
    rules = preconditions(module.resource("aws_ecs_task_definition", "worker"))
    return [r for r in rules if str(evaluate(r["error_message"], Scope(module, {})))
            .startswith("STREAMLEASE_")]


def terraform_accepts(module: Module, values: dict[str, Any]) -> bool:
    for name, value in values.items():
        if validation_errors(module, name, value):
            return False
    sc = scope(module, **values)
    return all(condition_holds(r["condition"], sc) for r in worker_preconditions(module))


def worker_accepts(values: dict[str, Any]) -> bool:
    variable_to_setting = {v: k for k, v in VARIABLE_OF.items()}
    env = {variable_to_setting[k]: as_env_value(v) for k, v in values.items() if v is not None}
    try:
        WorkerConfig.from_env(env)
    except ConfigError:
        return False
    return True


# Values on both sides of every rule in worker/config.py and worker/core/lease.py.
SETTING_CASES: list[dict[str, Any]] = [
    {},
    {"lease_seconds": 0}, {"lease_seconds": -1}, {"lease_seconds": 0.9, "heartbeat_seconds": 0.2,
                                                  "skew_margin_seconds": 0.5},
    {"heartbeat_seconds": 6.6}, {"heartbeat_seconds": 6.67}, {"heartbeat_seconds": 0},
    {"lease_seconds": 9, "heartbeat_seconds": 3}, {"lease_seconds": 9, "heartbeat_seconds": 2.9},
    {"skew_margin_seconds": 19.9}, {"skew_margin_seconds": 20}, {"skew_margin_seconds": 0},
    {"safety_margin_seconds": 6.6}, {"safety_margin_seconds": 6.7},
    {"safety_margin_seconds": 0}, {"safety_margin_seconds": None},
    {"sweep_seconds": 44}, {"sweep_seconds": 45}, {"sweep_seconds": 0},
    {"sweep_seconds": 40, "reconcile_seconds": 9}, {"sweep_seconds": 40, "reconcile_seconds": 10},
    {"reconcile_seconds": 0}, {"shutdown_seconds": 0}, {"shutdown_seconds": 0.5},
    {"max_streams": 0}, {"max_streams": 1}, {"max_streams": 100000}, {"max_streams": 100001},
    {"max_streams": 1.5},
    {"metrics_port": 0}, {"metrics_port": 65535}, {"metrics_port": 65536}, {"metrics_port": -1},
    {"allowed_urls": ["http://x"]}, {"allowed_urls": ["ws://", "wss://"]},
    {"allowed_urls": ["wss://a", "https://b"]},
    {"log_format": "text"}, {"log_format": "TEXT"}, {"log_format": "xml"},
    {"log_level": "debug"}, {"log_level": "WARNING"}, {"log_level": "TRACE"},
    {"acquire_per_cycle": 0}, {"acquire_per_cycle": 10000}, {"acquire_per_cycle": 10001},
    {"batch_max_messages": 0}, {"batch_max_messages": 1000}, {"batch_max_messages": 1001},
    {"batch_max_seconds": 0}, {"batch_max_seconds": 0.01},
    {"max_frame_bytes": 1023}, {"max_frame_bytes": 1024}, {"max_frame_bytes": 300000},
    {"max_frame_bytes": 300001},
    {"table_name": "ab"}, {"table_name": "abc"}, {"table_name": "a" * 255},
    {"table_name": "a" * 256}, {"table_name": "bad name"}, {"events_table_name": "ev.t-1_x"},
    {"events_table_name": "ev/t"},
]


@pytest.mark.parametrize("values", SETTING_CASES, ids=lambda v: repr(v)[:60])
def test_variable_rules_agree_with_the_worker(module: Module, values: dict[str, Any]) -> None:
    assert terraform_accepts(module, values) == worker_accepts(values)


# Where terraform is deliberately stricter than the worker, and why.
STRICTER_CASES: list[tuple[dict[str, Any], str]] = [
    ({"allowed_urls": []}, "an empty STREAMLEASE_ALLOWED_URLS falls back to the default "
                           "wss:// in the worker; terraform asks for an explicit list"),
    ({"allowed_urls": [" wss://a"]}, "the worker strips spaces; terraform refuses them"),
    ({"allowed_urls": ["wss://a,wss://b"]}, "the worker splits on commas; terraform wants "
                                            "one prefix per list element"),
]


@pytest.mark.parametrize(("values", "why"), STRICTER_CASES, ids=lambda v: repr(v)[:60])
def test_terraform_is_stricter_only_where_documented(module: Module, values: dict[str, Any],
                                                     why: str) -> None:
    assert worker_accepts(values) and not terraform_accepts(module, values), why


def test_the_cases_exercise_both_outcomes(module: Module) -> None:
    outcomes = [worker_accepts(v) for v in SETTING_CASES]
    assert outcomes.count(True) >= 15 and outcomes.count(False) >= 25


# --- ECS ------------------------------------------------------------------------------------


def container(module: Module, **overrides: Any) -> dict[str, Any]:
    td = module.resource("aws_ecs_task_definition", "worker")
    (found,) = evaluate(td["container_definitions"], scope(module, **overrides))
    assert isinstance(found, dict)
    return found


def deployment_rules_hold(module: Module, **overrides: Any) -> bool:
    rules = preconditions(module.resource("aws_ecs_task_definition", "worker"))
    sc = scope(module, **overrides)
    return all(condition_holds(r["condition"], sc) for r in rules)


def test_stop_timeout_exceeds_the_shutdown_budget(module: Module) -> None:
    defaults = module.defaults()
    margin = scope(module).local("stop_timeout_margin_seconds")
    assert margin >= 10
    assert defaults["stop_timeout_seconds"] >= defaults["shutdown_seconds"] + margin
    assert defaults["shutdown_seconds"] == float(DEFAULTS["STREAMLEASE_SHUTDOWN_SECONDS"])
    assert container(module)["stopTimeout"] == defaults["stop_timeout_seconds"]
    assert container(module, stop_timeout_seconds=77)["stopTimeout"] == 77
    assert deployment_rules_hold(module)
    assert not deployment_rules_hold(module, stop_timeout_seconds=30)  # 25 + 10 > 30
    assert not deployment_rules_hold(module, stop_timeout_seconds=35, shutdown_seconds=26)
    assert deployment_rules_hold(module, stop_timeout_seconds=120, shutdown_seconds=110)
    assert validation_errors(module, "stop_timeout_seconds", 121)  # the Fargate maximum
    assert not validation_errors(module, "stop_timeout_seconds", 120)


def test_health_check_needs_a_metrics_port(module: Module) -> None:
    assert not deployment_rules_hold(module, metrics_port=0)
    assert not deployment_rules_hold(module, metrics_port=80)  # non-root cannot bind it
    assert deployment_rules_hold(module, metrics_port=9200)
    assert container(module, metrics_port=9200)["portMappings"] == [
        {"name": "metrics", "containerPort": 9200, "protocol": "tcp"}]


def test_container_definition(module: Module) -> None:
    c = container(module)
    assert c["image"] == REQUIRED["image"]
    assert c["essential"] is True
    assert c["command"] == ["run"]
    assert c["readonlyRootFilesystem"] is True
    assert c.get("privileged", False) is False
    assert c["linuxParameters"]["initProcessEnabled"] is True
    assert c["linuxParameters"]["capabilities"]["drop"] == ["ALL"]
    # Liveness only: the healthcheck command asks /healthz, never /readyz.
    check = c["healthCheck"]
    assert check["command"][:3] == ["CMD", "streamlease", "healthcheck"]
    assert check["interval"] * check["retries"] >= float(DEFAULTS["STREAMLEASE_LEASE_SECONDS"])
    log = c["logConfiguration"]
    assert log["logDriver"] == "awslogs"
    assert log["options"]["awslogs-group"] == Unknown("aws_cloudwatch_log_group.worker.name")
    assert log["options"]["mode"] == "non-blocking"
    assert c["portMappings"][0]["containerPort"] == int(DEFAULTS["STREAMLEASE_METRICS_PORT"])
    # A writable /tmp on the read-only root, from a task volume without a host path.
    td = module.resource("aws_ecs_task_definition", "worker")
    volumes = {evaluate(v["name"], scope(module)): v for v in blocks(td, "volume")}
    (mount,) = c["mountPoints"]
    assert mount == {"sourceVolume": "tmp", "containerPath": "/tmp", "readOnly": False}
    assert set(volumes) == {"tmp"} and set(volumes["tmp"]) == {"name"}


def test_task_definition_is_fargate_awsvpc(module: Module) -> None:
    td = module.resource("aws_ecs_task_definition", "worker")
    sc = scope(module)
    assert evaluate(td["requires_compatibilities"], sc) == ["FARGATE"]
    assert evaluate(td["network_mode"], sc) == "awsvpc"
    (platform,) = blocks(td, "runtime_platform")
    assert evaluate(platform["operating_system_family"], sc) == "LINUX"


def test_service_deploys_safely_without_a_public_ip(module: Module) -> None:
    svc = module.resource("aws_ecs_service", "worker")
    sc = scope(module)
    assert evaluate(svc["deployment_minimum_healthy_percent"], sc) == 100
    assert evaluate(svc["deployment_maximum_percent"], sc) == 200
    (breaker,) = blocks(svc, "deployment_circuit_breaker")
    assert evaluate(breaker["enable"], sc) is True and evaluate(breaker["rollback"], sc) is True
    (network,) = blocks(svc, "network_configuration")
    assert evaluate(network["assign_public_ip"], sc) is False
    assert evaluate(network["security_groups"], sc) == [Unknown("aws_security_group.worker.id")]
    assert "launch_type" not in svc  # capacity providers decide
    (strategy,) = dynamic_blocks(svc, "capacity_provider_strategy")
    assert strategy["for_each"] == "${var.capacity_provider_strategy}"
    cluster_cps = module.resource("aws_ecs_cluster_capacity_providers", "this")
    assert evaluate(cluster_cps["capacity_providers"], sc) == ["FARGATE", "FARGATE_SPOT"]


@pytest.mark.parametrize(("strategy", "ok"), [
    ([{"capacity_provider": "FARGATE", "weight": 1, "base": 1}], True),
    ([{"capacity_provider": "FARGATE", "weight": 1, "base": 1},
      {"capacity_provider": "FARGATE_SPOT", "weight": 3, "base": 0}], True),
    ([{"capacity_provider": "FARGATE_SPOT", "weight": 1, "base": 0}], True),
    ([{"capacity_provider": "EC2", "weight": 1, "base": 0}], False),
    ([{"capacity_provider": "FARGATE", "weight": 0, "base": 0}], False),
    ([{"capacity_provider": "FARGATE", "weight": 1, "base": 0},
      {"capacity_provider": "FARGATE", "weight": 1, "base": 0}], False),
    ([{"capacity_provider": "FARGATE", "weight": 1, "base": 1},
      {"capacity_provider": "FARGATE_SPOT", "weight": 1, "base": 1}], False),  # one base only
    ([], False),
])
def test_capacity_providers_are_selectable(module: Module, strategy: list[dict[str, Any]],
                                           ok: bool) -> None:
    assert (not validation_errors(module, "capacity_provider_strategy", strategy)) is ok


def test_example_strategy_is_valid_for_the_module(module: Module, example: Module) -> None:
    (call,) = example.module_calls.values()
    for share in (0, 2):
        sc = example.scope(region="eu-west-1", image=REQUIRED["image"], vpc_id="vpc-1",
                           private_subnet_ids=["subnet-1"], fargate_spot_share=share)
        strategy = evaluate(call["capacity_provider_strategy"], sc)
        assert len(strategy) == (2 if share else 1)
        assert not validation_errors(module, "capacity_provider_strategy", strategy)


# --- network --------------------------------------------------------------------------------


def test_egress_only_to_aws_apis_and_upstreams(module: Module) -> None:
    sg = module.resource("aws_security_group", "worker")
    assert "ingress" not in sg and "egress" not in sg  # rules are separate resources
    rules = scope(module).local("egress_rules")
    assert set(rules) == {"0.0.0.0/0 443-443"}  # both defaults: 443 anywhere, one rule
    narrowed = scope(module, aws_api_egress_cidr_blocks=["10.0.0.0/16"], upstream_egress=[
        {"description": "feeds", "cidr_blocks": ["203.0.113.0/24"], "from_port": 8443,
         "to_port": 8443}]).local("egress_rules")
    assert {(r["cidr"], r["from_port"], r["to_port"]) for r in narrowed.values()} == {
        ("10.0.0.0/16", 443, 443), ("203.0.113.0/24", 8443, 8443)}
    egress = module.resource("aws_vpc_security_group_egress_rule", "worker")
    assert egress["for_each"] == "${local.egress_rules}"
    assert evaluate(egress["ip_protocol"], scope(module)) == "tcp"
    assert validation_errors(module, "upstream_egress", [
        {"description": "x", "cidr_blocks": ["0.0.0.0/0"], "from_port": 0, "to_port": 65535}])
    assert validation_errors(module, "aws_api_egress_cidr_blocks", ["::/0"])


def test_metrics_port_open_only_to_the_scraper_group(module: Module) -> None:
    ingress_rules = module.resources_of("aws_vpc_security_group_ingress_rule")
    assert set(ingress_rules) == {"metrics"}
    rule = ingress_rules["metrics"]
    assert "cidr_ipv4" not in rule and "cidr_ipv6" not in rule and "prefix_list_id" not in rule
    assert rule["referenced_security_group_id"] == "${var.scraper_security_group_id}"
    assert evaluate(rule["count"], scope(module)) == 0  # no scraper given: closed
    sc = scope(module, scraper_security_group_id="sg-0abc")
    assert evaluate(rule["count"], sc) == 1
    assert evaluate(rule["from_port"], sc) == evaluate(rule["to_port"], sc) == 9108


def test_log_group_keeps_json_logs_with_retention(module: Module) -> None:
    group = module.resource("aws_cloudwatch_log_group", "worker")
    assert evaluate(group["retention_in_days"], scope(module)) == 365
    assert validation_errors(module, "log_retention_days", 13)
    assert DEFAULTS["STREAMLEASE_LOG_FORMAT"] == "json" == module.defaults()["log_format"]
