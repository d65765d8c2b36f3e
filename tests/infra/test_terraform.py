"""The terraform in terraform/ against the code, with terraform itself (offline, see
tests/infra/tf.py) and python-hcl2 for what a plan does not show.

Where the checks live:
- terraform/modules/streamlease/tests/*.tftest.hcl: every validation and precondition
  both ways, and what the plan must always hold (table protection, the container's
  hardening, the service, the security group rules). Run here, one test per run.
- here, on the module's plan (conftest.PLAN_RUNS): what must match worker/ (the tables
  and worker/store/schema.py, the task role and the DynamoDB calls in worker/store/, the
  environment and worker/config.py SETTINGS, the container and the worker's defaults);
- here, worker_cases.py: generated runs compare each worker setting's bounds with its
  variable's validation, and each committed run's expectation is checked against the
  worker's verdict on its inputs;
- here, statically: the terraform block, variable descriptions, references between
  blocks, the READMEs.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.infra import store_calls, worker_cases
from tests.infra.conftest import Terraform
from tests.infra.tf import (
    EXAMPLE_DIR,
    MODULE_DIR,
    ROOT,
    TASK_DEFINITION,
    TERRAFORM,
    Report,
    StaticModule,
    Toolchain,
    iter_blocks,
    literal,
    load_static,
    offline_env,
    parse_hcl,
    planned,
    planned_outputs,
)
from worker.config import DEFAULTS, SETTINGS, WorkerConfig
from worker.store import schema

COMMITTED_TESTS = sorted((MODULE_DIR / "tests").glob("*.tftest.hcl"))
EXAMPLE_TESTS = sorted((EXAMPLE_DIR / "tests").glob("*.tftest.hcl"))


@pytest.fixture(scope="module")
def module() -> StaticModule:
    return load_static(MODULE_DIR)


@pytest.fixture(scope="module")
def example() -> StaticModule:
    return load_static(EXAMPLE_DIR)


def runs_of(paths: list[Path]) -> list[tuple[str, str]]:
    """(file relative to its root, run name) of every run in these test files."""
    found = []
    for path in paths:
        for block in parse_hcl(path).get("run", []):
            for name in block:
                found.append((f"tests/{path.name}", name))
    return found


# --- the toolchain, and the committed terraform tests -------------------------------------


@pytest.mark.parametrize("root", ["streamlease", "ecs-fargate"])
def test_module_and_example_validate(terraform: Terraform, root: str) -> None:
    """`terraform validate`: syntax, references, types, and that the example passes only
    arguments the module declares and every one it requires."""
    result = terraform.validation(root)
    problems = [f"{d.get('severity')}: {d.get('summary')} {d.get('detail', '')}"
                for d in result.get("diagnostics", [])]
    assert result["valid"] and not problems, problems


def test_every_file_is_formatted(toolchain: Toolchain) -> None:
    proc = subprocess.run([toolchain.binary, "fmt", "-check", "-recursive", "-diff", "-no-color",
                           str(TERRAFORM)], capture_output=True, text=True, timeout=120,
                          env=offline_env({}), check=False)
    assert proc.returncode == 0, f"run `terraform fmt -recursive terraform/`:\n{proc.stdout}"


@pytest.mark.parametrize(("file", "run"), runs_of(COMMITTED_TESTS),
                         ids=lambda v: str(v).removeprefix("tests/"))
def test_module_terraform_test(module_report: Report, file: str, run: str) -> None:
    result = module_report.run(file, run)
    assert result.status == "pass", result.explain()


@pytest.mark.parametrize(("file", "run"), runs_of(EXAMPLE_TESTS),
                         ids=lambda v: str(v).removeprefix("tests/"))
def test_example_terraform_test(example_report: Report, file: str, run: str) -> None:
    result = example_report.run(file, run)
    assert result.status == "pass", result.explain()


def test_committed_tests_refuse_every_validated_variable(module: StaticModule) -> None:
    """Each variable with a validation is refused in some committed run (the accepting
    side: the defaults run and the edge runs, which must pass)."""
    refused: set[str] = set()
    preconditions_refused = 0
    for path in COMMITTED_TESTS:
        for block in parse_hcl(path).get("run", []):
            for body in block.values():
                for expr in body.get("expect_failures", []):
                    name = str(expr).removeprefix("${").removesuffix("}")
                    if name == TASK_DEFINITION:
                        preconditions_refused += 1
                    refused.add(name.removeprefix("var."))
    validated = {n for n, b in module.variables.items() if list(iter_blocks(b, "validation"))}
    assert validated <= refused, f"never refused in tests/*.tftest.hcl: {validated - refused}"
    rules = sum(len(list(iter_blocks(lc, "precondition")))
                for lc in iter_blocks(module.resources[("aws_ecs_task_definition", "worker")],
                                      "lifecycle"))
    assert preconditions_refused >= rules, (preconditions_refused, rules)


# --- the worker's settings against the module's rules ---------------------------------------

RULES = worker_cases.Cases(load_static(MODULE_DIR))
CASES = RULES.all()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_worker_and_terraform_agree(module_report: Report, case: worker_cases.Case) -> None:
    result = module_report.run(worker_cases.file_name(case), "case")
    if result.status == "pass":
        return
    named = " ".join(d.split(" [", 1)[0] for d in result.diagnostics)  # without snippets
    shown = {k: v for k, v in case.values.items() if f"var.{k}" in named} or case.values
    lines = [f"  {k} = {short(v)}: the worker {RULES.verdict_text(k, v)}"
             for k, v in shown.items()]
    pytest.fail(f"terraform and the worker disagree:\n{result.explain()}\n"
                f"expected failures: {case.expect or 'none'}\n" + "\n".join(lines))


def short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


COMMITTED_CASES = worker_cases.committed_cases(
    p for p in COMMITTED_TESTS if p.name != "module.tftest.hcl")


@pytest.mark.parametrize("case", COMMITTED_CASES, ids=lambda c: c.name)
def test_committed_runs_expect_what_the_worker_decides(case: worker_cases.Case) -> None:
    """Each committed run's expectation is the worker's verdict on its inputs (terraform
    meeting that expectation is test_module_terraform_test)."""
    problems = RULES.disagreements(case)
    assert not problems, "\n".join(problems)


def test_the_cases_exercise_both_outcomes() -> None:
    refused = [c for c in CASES if any(e.startswith("var.") for e in c.expect)]
    assert len(refused) >= 4 and sum(len(c.values) for c in refused) >= 40, refused
    assert len([c for c in CASES if not c.expect]) >= 1
    rules = [c for c in COMMITTED_CASES if c.expect == [TASK_DEFINITION]]
    assert len(rules) >= 6, rules  # every rule between settings, refused on its boundary
    assert len([c for c in COMMITTED_CASES if not c.expect]) >= 3


def test_every_worker_setting_is_a_variable_with_the_workers_default(
        module: StaticModule) -> None:
    cases = worker_cases.Cases(module)
    assert not cases.missing, "worker/config.py SETTINGS has no terraform variable for " + \
        ", ".join(f"{name} (add `variable \"{name.removeprefix('STREAMLEASE_').lower()}\"` "
                  f"to terraform/modules/streamlease/variables.tf, its description starting "
                  f"'{name}:', with the worker's default and bounds, and pass it in "
                  "local.worker_settings in ecs.tf)" for name in cases.missing)
    for setting in SETTINGS:
        variable = cases.variable_of.get(setting.name)
        if variable is None:
            continue
        text = worker_cases.env_text(cases.kind[variable], cases.defaults.get(variable))
        assert text == (setting.default or None), (
            f"variable {variable} defaults to {text!r}, {setting.name} to {setting.default!r}")
    assert not any("worker_id" in v for v in module.variables)


# --- tables -----------------------------------------------------------------------------


def as_create_table(values: dict[str, Any]) -> dict[str, Any]:
    """A planned aws_dynamodb_table in the shape of CreateTable's arguments."""
    keys = [{"AttributeName": values["hash_key"], "KeyType": "HASH"}]
    if values.get("range_key"):
        keys.append({"AttributeName": values["range_key"], "KeyType": "RANGE"})
    out: dict[str, Any] = {
        "TableName": values["name"],
        "BillingMode": values["billing_mode"],
        "AttributeDefinitions": sorted(
            ({"AttributeName": a["name"], "AttributeType": a["type"]} for a in values["attribute"]),
            key=lambda a: a["AttributeName"]),
        "KeySchema": keys,
    }
    indexes = []
    for gsi in values.get("global_secondary_index") or []:
        index_keys = [{"AttributeName": gsi["hash_key"], "KeyType": "HASH"}]
        if gsi.get("range_key"):
            index_keys.append({"AttributeName": gsi["range_key"], "KeyType": "RANGE"})
        indexes.append({"IndexName": gsi["name"], "KeySchema": index_keys,
                        "Projection": {"ProjectionType": gsi["projection_type"]}})
    if indexes:
        out["GlobalSecondaryIndexes"] = indexes
    return out


def sorted_definitions(definition: dict[str, Any]) -> dict[str, Any]:
    return {**definition, "AttributeDefinitions": sorted(
        definition["AttributeDefinitions"], key=lambda a: a["AttributeName"])}


@pytest.mark.parametrize(("name", "expected"), [
    ("streams", schema.streams_table(DEFAULTS["STREAMLEASE_TABLE"])),
    ("events", schema.events_table(DEFAULTS["STREAMLEASE_EVENTS_TABLE"])),
])
def test_tables_are_the_worker_schema(module_plans: dict[str, Any], name: str,
                                      expected: dict[str, Any]) -> None:
    values = planned(module_plans["defaults"])[f"aws_dynamodb_table.{name}"]
    assert as_create_table(values) == sorted_definitions(expected)


def test_index_name_is_the_codec_s(module_plans: dict[str, Any]) -> None:
    from worker.store import codec

    assert planned_outputs(module_plans["defaults"])["streams_index_name"] == codec.INDEX_NAME


# --- IAM ------------------------------------------------------------------------------------

Condition = tuple[str, str, tuple[str, ...]]
Grants = dict[str, dict[str, frozenset[Condition]]]


def policy(plan: dict[str, Any], name: str) -> Grants:
    """{resource: {action: conditions}} of one aws_iam_policy_document, as planned."""
    values = planned(plan)[f"data.aws_iam_policy_document.{name}"]
    grants: Grants = {}
    for statement in values["statement"]:
        assert statement["effect"] in (None, "Allow"), statement
        assert not statement["not_actions"] and not statement["not_resources"], statement
        conditions = frozenset((c["test"], c["variable"], tuple(sorted(c["values"])))
                               for c in statement["condition"])
        for resource in statement["resources"]:
            for action in statement["actions"]:
                assert action not in grants.get(resource, {}), (resource, action)
                grants.setdefault(resource, {})[action] = conditions
    return grants


def differences(actual: Grants, expected: Grants) -> list[str]:
    """Readable differences between two policies' grants."""
    out = []
    for resource in sorted(set(actual) | set(expected)):
        have, want = actual.get(resource, {}), expected.get(resource, {})
        for action in sorted(set(have) | set(want)):
            if action not in want:
                out.append(f"{resource}: {action} is granted, not needed")
            elif action not in have:
                out.append(f"{resource}: {action} is needed, not granted")
            elif have[action] != want[action]:
                out.append(f"{resource}: {action} has conditions {sorted(have[action])}, "
                           f"expected {sorted(want[action])}")
    return out


def arns(plan: dict[str, Any]) -> dict[str, str]:
    values = planned(plan)
    streams = values["aws_dynamodb_table.streams"]["arn"]
    return {
        "streams": streams,
        "index": f"{streams}/index/{planned_outputs(plan)['streams_index_name']}",
        "events": values["aws_dynamodb_table.events"]["arn"],
        "logs": values["aws_cloudwatch_log_group.worker"]["arn"],
    }


def key_attributes(definition: dict[str, Any]) -> set[str]:
    keys = {k["AttributeName"] for k in definition["KeySchema"]}
    for index in definition.get("GlobalSecondaryIndexes", []):
        keys |= {k["AttributeName"] for k in index["KeySchema"]}
    return keys


def worker_needs() -> store_calls.Needs:
    methods = store_calls.store_methods()
    used = store_calls.methods_called(store_calls.worker_run_files(), methods)
    assert {"acquire", "renew", "release", "orphans", "adopt", "write_batch",
            "check_tables"} <= used, f"worker methods found: {sorted(used)}"
    return store_calls.needs(used, methods)


def test_store_operations_are_the_known_set() -> None:
    """A new DynamoDB call anywhere in worker/store/ must come with an IAM review."""
    methods = store_calls.store_methods()
    every = store_calls.needs(list(methods), methods)
    assert every.operations == {"create_table", "describe_table", "get_item", "query", "scan",
                                "transact_write_items", "update_item"}
    assert every.transaction_kinds == {"Update", "Put"}


def test_the_worker_updates_only_lease_and_error_attributes() -> None:
    """The attributes a worker's UpdateItem may name (the task role allows no others): a
    change here is a change to the IAM policy (iam.tf local.worker_stream_attributes)."""
    needs = worker_needs()
    assert {u.table for u in needs.updates} == {"streams"}, needs.updates
    known = {"Pk", "desired_state", "lease_owner", "lease_expires_at_ms", "fence", "last_seq",
             "last_error", "last_error_at_ms"}
    new = [f"{u.where}: {sorted(u.attributes - known)}" for u in needs.updates
           if u.attributes - known]
    assert not new, "worker UpdateItems name attributes the task role does not allow:\n" \
        + "\n".join(new)
    assert needs.updated_attributes("streams") == known


def test_task_role_grants_exactly_what_the_worker_calls(module_plans: dict[str, Any]) -> None:
    plan = module_plans["defaults"]
    arn = arns(plan)
    needs = worker_needs()
    unconditioned: frozenset[Condition] = frozenset()
    # Every attribute a worker UpdateItem names, and (the IAM documentation's rule for
    # dynamodb:Attributes) every key attribute of the table and its indexes.
    attributes = needs.updated_attributes("streams") | key_attributes(
        schema.streams_table("any"))
    assert "ws_url" not in attributes  # only operators re-point a stream
    only_in_transactions = frozenset({(
        "StringEquals", "dynamodb:EnclosingOperation", ("TransactWriteItems",))})
    expected: Grants = {
        # check_tables; the sweep (unindexed) that finds items without lease fields or
        # with a bad desired_state, which the sparse index cannot show; acquire, renew,
        # release, adopt, record_error and the sink's checkpoint Update.
        arn["streams"]: {
            "dynamodb:DescribeTable": unconditioned,
            "dynamodb:Scan": unconditioned,
            "dynamodb:UpdateItem": frozenset({(
                "ForAllValues:StringEquals", "dynamodb:Attributes", tuple(sorted(attributes)))}),
        },
        arn["index"]: {"dynamodb:Query": unconditioned},  # orphans: the sparse index only
        arn["events"]: {  # check_tables; the sink's Puts, in its transaction only
            "dynamodb:DescribeTable": unconditioned,
            "dynamodb:PutItem": only_in_transactions,
        },
    }
    assert not differences(policy(plan, "task"), expected), \
        "\n".join(differences(policy(plan, "task"), expected))
    # ... and that is what the code the worker runs calls: every action, and the
    # transaction condition exactly on the actions it sends only inside transactions.
    granted = {a: c for actions in expected.values() for a, c in actions.items()}
    assert set(granted) == needs.iam_actions(), (
        f"the task role grants {sorted(granted)}; the worker calls {sorted(needs.iam_actions())}")
    in_transactions = {a for a, c in granted.items() if c == only_in_transactions}
    assert in_transactions == needs.transaction_only_actions(), (
        f"dynamodb:EnclosingOperation = TransactWriteItems is on {sorted(in_transactions)}; "
        f"the worker sends only {sorted(needs.transaction_only_actions())} inside "
        "transactions and nothing else (a condition on an action it also sends alone "
        "would refuse those calls)")


def test_operator_policy_covers_ctl_and_table_create(module_plans: dict[str, Any]) -> None:
    plan = module_plans["defaults"]
    arn = arns(plan)
    none: frozenset[Condition] = frozenset()
    grants = policy(plan, "operator")
    assert grants == {
        arn["streams"]: dict.fromkeys(["dynamodb:CreateTable", "dynamodb:DescribeTable",
                                       "dynamodb:GetItem", "dynamodb:Scan",
                                       "dynamodb:UpdateItem"], none),
        arn["events"]: dict.fromkeys(["dynamodb:CreateTable", "dynamodb:DescribeTable",
                                      "dynamodb:Query"], none),
    }
    methods = store_calls.store_methods()
    used = store_calls.methods_called(store_calls.operator_files(), methods)
    needed = store_calls.needs(used, methods).iam_actions()
    assert {a for actions in grants.values() for a in actions} == needed


@pytest.mark.parametrize("name", ["task", "operator"])
def test_dynamodb_policies_have_no_wildcards(module_plans: dict[str, Any], name: str) -> None:
    for resource, actions in policy(module_plans["defaults"], name).items():
        assert "*" not in resource and all("*" not in a for a in actions), resource


def test_execution_role_pulls_only_its_image_and_writes_only_its_logs(
        module_plans: dict[str, Any]) -> None:
    plan = module_plans["defaults"]
    logs = f"{arns(plan)['logs']}:*"
    none: frozenset[Condition] = frozenset()
    write_logs = {"logs:CreateLogStream": none, "logs:PutLogEvents": none}
    assert policy(plan, "execution") == {
        logs: write_logs,
        # derived from the ECR image's registry and repository
        "arn:aws:ecr:eu-west-1:123456789012:repository/streamlease": {
            "ecr:BatchGetImage": none, "ecr:GetDownloadUrlForLayer": none},
        # GetAuthorizationToken has no resource-level permission.
        "*": {"ecr:GetAuthorizationToken": none},
    }
    custom = module_plans["custom"]  # an image outside ECR: no ECR permissions at all
    assert policy(custom, "execution") == {f"{arns(custom)['logs']}:*": write_logs}


def test_role_policies_attach_their_own_documents(module: StaticModule) -> None:
    """Which document each inline policy holds (a plan leaves the JSON unknown)."""
    for name in ("task", "execution"):
        attached = module.resources[("aws_iam_role_policy", name)]
        assert attached["policy"] == f"${{data.aws_iam_policy_document.{name}.json}}", name
        assert attached["role"] == f"${{aws_iam_role.{name}.id}}", name
        role = module.resources[("aws_iam_role", name)]
        assert role["assume_role_policy"] == "${data.aws_iam_policy_document.ecs_tasks_assume.json}"
    assert module.outputs["operator_policy_json"]["value"] == \
        "${data.aws_iam_policy_document.operator.json}"
    # Nothing in the module attaches the operator policy: it is for people, not tasks.
    for body in module.resources.values():
        assert "data.aws_iam_policy_document.operator" not in str(body)


# --- the worker's environment and container -----------------------------------------------


def container(plan: dict[str, Any]) -> dict[str, Any]:
    (found,) = json.loads(planned(plan)[TASK_DEFINITION]["container_definitions"])
    assert isinstance(found, dict)
    return found


def environment(plan: dict[str, Any]) -> dict[str, str]:
    entries = container(plan)["environment"]
    env = {e["name"]: e["value"] for e in entries}
    assert len(env) == len(entries)
    return env


def test_task_environment_carries_every_setting_at_its_default(
        module_plans: dict[str, Any], module: StaticModule) -> None:
    plan = module_plans["defaults"]
    env = environment(plan)
    values = planned(plan)
    assert env.pop("AWS_REGION") == "eu-west-1"  # the provider's region
    assert env["STREAMLEASE_TABLE"] == values["aws_dynamodb_table.streams"]["name"]
    assert env["STREAMLEASE_EVENTS_TABLE"] == values["aws_dynamodb_table.events"]["name"]
    assert "STREAMLEASE_WORKER_ID" not in env  # the ECS task id, so never shared
    cases = worker_cases.Cases(module)
    missing = set(cases.variable_of) - set(env) - {"STREAMLEASE_SAFETY_MARGIN_SECONDS"}
    assert not missing, f"not passed to the container (ecs.tf local.worker_settings): {missing}"
    assert "STREAMLEASE_SAFETY_MARGIN_SECONDS" not in env  # unset: a tenth of the lease
    assert set(env) <= {s.name for s in SETTINGS}, set(env) - {s.name for s in SETTINGS}
    for name, text in env.items():
        assert text == DEFAULTS[name], f"{name}: the module writes {text!r}, the worker's " \
                                       f"default is {DEFAULTS[name]!r}"
    assert WorkerConfig.from_env(env) == WorkerConfig.from_env({})


def test_task_environment_follows_the_inputs(module_plans: dict[str, Any]) -> None:
    env = environment(module_plans["custom"])
    assert env["STREAMLEASE_LEASE_SECONDS"] == "9"
    assert env["STREAMLEASE_HEARTBEAT_SECONDS"] == "2.5"
    assert env["STREAMLEASE_SAFETY_MARGIN_SECONDS"] == "1.5"
    assert env["STREAMLEASE_ALLOWED_URLS"] == "wss://a.example/,ws://b.example/"
    assert env["STREAMLEASE_METRICS_PORT"] == "9200"
    assert env["STREAMLEASE_LOG_LEVEL"] == "debug"
    config = WorkerConfig.from_env(env)
    assert (config.timings.lease_s, config.timings.safety_margin_s) == (9, 1.5)
    assert config.allowed_urls == ("wss://a.example/", "ws://b.example/")


def test_stop_timeout_exceeds_the_shutdown_budget(module_plans: dict[str, Any]) -> None:
    """The defaults leave ECS's SIGKILL at least 10 s after the worker's drain budget
    (the precondition on other values is in tests/preconditions.tftest.hcl)."""
    defaults = container(module_plans["defaults"])
    shutdown = float(DEFAULTS["STREAMLEASE_SHUTDOWN_SECONDS"])
    assert environment(module_plans["defaults"])["STREAMLEASE_SHUTDOWN_SECONDS"] == \
        DEFAULTS["STREAMLEASE_SHUTDOWN_SECONDS"]
    assert defaults["stopTimeout"] >= shutdown + 10
    assert container(module_plans["custom"])["stopTimeout"] == 77


def test_container_uses_the_workers_defaults(module_plans: dict[str, Any]) -> None:
    c = container(module_plans["defaults"])
    assert c["portMappings"] == [{"name": "metrics", "protocol": "tcp",
                                  "containerPort": int(DEFAULTS["STREAMLEASE_METRICS_PORT"])}]
    check = c["healthCheck"]
    assert check["interval"] * check["retries"] >= float(DEFAULTS["STREAMLEASE_LEASE_SECONDS"])
    assert DEFAULTS["STREAMLEASE_LOG_FORMAT"] == "json"  # what CloudWatch Logs Insights reads
    assert container(module_plans["custom"])["portMappings"][0]["containerPort"] == 9200


# --- the example ----------------------------------------------------------------------------


def example_service(report: Report, run: str) -> dict[str, Any]:
    result = report.run("tests/example.tftest.hcl", run)
    assert result.status == "pass" and result.plan is not None, result.explain()
    service: dict[str, Any] = planned(result.plan)["module.streamlease.aws_ecs_service.worker"]
    return service


def test_example_keeps_a_regular_fargate_base(example_report: Report) -> None:
    regular = example_service(example_report, "regular_fargate_only")
    assert regular["capacity_provider_strategy"] == [
        {"capacity_provider": "FARGATE", "weight": 1, "base": 1}]
    assert regular["desired_count"] == 3  # from terraform.tfvars.example
    spot = example_service(example_report, "spot_beside_a_regular_base")
    assert sorted(spot["capacity_provider_strategy"], key=lambda s: s["capacity_provider"]) == [
        {"capacity_provider": "FARGATE", "weight": 1, "base": 1},
        {"capacity_provider": "FARGATE_SPOT", "weight": 4, "base": 0}]


# --- statically -------------------------------------------------------------------------------


def test_module_and_example_pin_terraform_and_provider(module: StaticModule,
                                                       example: StaticModule) -> None:
    for mod in (module, example):
        (settings,) = mod.terraform
        assert re.fullmatch(r">= ?1\.(5|[6-9]|1\d)\.\d+", literal(settings["required_version"]))
        (providers,) = settings["required_providers"]
        assert literal(providers["aws"]) == {"source": "hashicorp/aws", "version": "~> 5.0"}
    (call,) = example.module_calls.values()
    assert (EXAMPLE_DIR / literal(call["source"])).resolve() == MODULE_DIR.resolve()


def test_every_variable_is_typed_described_and_validated(module: StaticModule) -> None:
    no_validation_ok = {"tags", "deletion_protection"}  # a map of strings, a bool
    for name, block in module.variables.items():
        assert "type" in block, name
        assert module.description(name), name
        if name not in no_validation_ok:
            assert list(iter_blocks(block, "validation")), f"variable {name} has no validation"


def test_readme_tables_list_every_input_and_output(module: StaticModule) -> None:
    readme = (TERRAFORM / "README.md").read_text()
    for name in module.variables:
        assert re.search(rf"^\| `{name}` \|", readme, re.M), f"input {name} missing from README"
    for name in module.outputs:
        assert re.search(rf"^\| `{name}` \|", readme, re.M), f"output {name} missing from README"


def test_network_rules_are_separate_resources(module: StaticModule) -> None:
    """Rules as their own resources (none inline in the group, which would fight them);
    one ingress rule, the metrics port; the service leaves placement to capacity
    providers."""
    group = module.resources[("aws_security_group", "worker")]
    assert "ingress" not in group and "egress" not in group
    assert set(module.resources_of("aws_vpc_security_group_ingress_rule")) == {"metrics"}
    assert set(module.resources_of("aws_security_group_rule")) == set()
    assert "launch_type" not in module.resources[("aws_ecs_service", "worker")]


def test_no_working_files_in_the_source_tree(terraform: Terraform, module_report: Report,
                                            example_report: Report) -> None:
    """init and test ran in a temporary copy: the source tree is as it was before."""
    terraform.module_plans.report()
    assert sorted(TERRAFORM.rglob("*")) == terraform.source_files
    gitignore = (ROOT / ".gitignore").read_text().splitlines()
    assert {".terraform/", ".terraform.lock.hcl"} <= set(gitignore)
