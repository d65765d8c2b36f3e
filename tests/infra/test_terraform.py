"""The terraform in terraform/ against the code, with terraform itself (offline, see
tests/infra/tf.py) and python-hcl2 for what a plan does not show.

Where the checks live:
- terraform/modules/streamlease/tests/*.tftest.hcl: every validation and precondition
  both ways, and what the plan must always hold (table protection, the container's
  hardening, the service, the security group rules). Run here, one test per run.
- here, on the module's plan (conftest.PLAN_RUNS): what must match worker/ (the tables
  and streamlease/store/schema.py, the task role and the DynamoDB calls in
  streamlease/store/ and the sink outputs' calls in streamlease/sinks/ (sink_calls.py),
  the environment and streamlease/config.py SETTINGS, the container and the worker's
  defaults);
- here, worker_cases.py: generated runs compare each worker setting's bounds with its
  variable's validation, and each committed run's expectation is checked against the
  worker's verdict on its inputs;
- here, without terraform: the MongoDB URL patterns of the leader backend's and the
  sink's validations, run with Python's re against the worker's parsers;
- here, statically: the terraform block, variable descriptions, references between
  blocks, the READMEs.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from streamlease.config import DEFAULTS, SETTINGS, WorkerConfig
from streamlease.core.backends import MongoTarget, RedisTarget, parse_leader_backend
from streamlease.core.sinks import parse_sink
from streamlease.core.stream import stream_buffer_bytes
from streamlease.store import feedcheckpoints, fleetcodec, schema
from streamlease.store.dynamodb.admin import DynamoAdmin
from tests.infra import sink_calls, store_calls, worker_cases
from tests.infra.conftest import PLAN_RUNS, Terraform
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
    assert not cases.missing, "streamlease/config.py SETTINGS has no terraform variable for " + \
        ", ".join(f"{name} (add `variable \"{name.removeprefix('STREAMLEASE_').lower()}\"` "
                  f"to terraform/modules/streamlease/variables.tf, its description starting "
                  f"'{name}:', with the worker's default and bounds, and pass it in "
                  "local.worker_settings in ecs.tf)" for name in cases.missing)
    for setting in SETTINGS:
        variable = cases.variable_of.get(setting.name)
        if variable is None:
            continue
        if cases.kind[variable] == "bool":
            # a switch (worker_cases.env_text): true, the default, leaves the setting out
            # for the worker's own default, on; false writes off
            assert cases.defaults.get(variable) is True and setting.default == "on", (
                f"variable {variable} defaults to {cases.defaults.get(variable)!r}, "
                f"{setting.name} to {setting.default!r}")
            continue
        text = worker_cases.env_text(cases.kind[variable], cases.defaults.get(variable))
        assert text == (setting.default or None), (
            f"variable {variable} defaults to {text!r}, {setting.name} to {setting.default!r}")
    assert not any("worker_id" in v for v in module.variables)


# --- MongoDB URLs: the module's patterns against the worker's parsers, without terraform ---
#
# The committed and generated runs above put MongoDB URLs through terraform where it is
# installed. These read the patterns out of variables.tf and run them with Python's re
# (the patterns use only what RE2 and re read alike), so that the shape terraform lets
# through is checked against the worker's own parser everywhere: listed URLs both ways,
# and a seeded stream of mutated ones, of which terraform may accept only what the
# worker accepts.

CAN_REGEX = re.compile(r'(!?)can\(regex\("((?:[^"\\]|\\.)*)", var\.(\w+)\)\)')


def mongodb_rule(module: StaticModule, variable: str) -> Callable[[str], bool]:
    """What the variable's validations decide about a MongoDB URL's shape: it matches one
    of the patterns starting ^(?i:mongodb that a `can(regex(...))` tests (the forms,
    alternatives of one condition) and none of those a `!can(regex(...))` refuses (a
    sink's collection rules). Credentials are the committed runs' (STRICTER)."""
    shapes, refusals = [], []
    for block in iter_blocks(module.variables[variable], "validation"):
        for negated, text, name in CAN_REGEX.findall(str(block["condition"])):
            pattern = json.loads(f'"{text}"')  # HCL's escapes here are JSON's
            if name != variable or not pattern.startswith("^(?i:mongodb"):
                continue
            # RE2's $ is the end of the text; re's $ also matches before a final newline.
            compiled = re.compile(re.sub(r"\$$", r"\\Z", pattern))
            (refusals if negated else shapes).append(compiled)
    assert len(shapes) == 2, f"var.{variable}: mongodb:// and mongodb+srv:// patterns, " \
                             f"found {len(shapes)}"

    def accepts(url: str) -> bool:
        return any(p.search(url) for p in shapes) and not any(p.search(url) for p in refusals)
    return accepts


def worker_takes_leader(url: str) -> bool:
    try:
        return isinstance(parse_leader_backend(url), MongoTarget)
    except ValueError:
        return False


def worker_takes_sink(url: str) -> bool:
    try:
        return parse_sink(url).kind == "mongodb"
    except ValueError:
        return False


# variable: (the worker's parser, URLs both take, URLs both refuse, URLs only the worker
# takes: where terraform is narrower on purpose).
MONGODB_URLS: dict[str, tuple[Callable[[str], bool], list[str], list[str], list[str]]] = {
    "leader_backend": (worker_takes_leader, [
        "mongodb://db1.internal:27017,db2.internal:27017,db3.internal:27017/streamlease"
        "?replicaSet=rs0&authSource=admin&tls=true",
        "mongodb+srv://cluster0.ab1cd.mongodb.net/streamlease?retryWrites=true&w=majority",
        "MONGODB://10.0.3.7/app",
        "Mongodb+SRV://c.example.net/app",
        "mongodb://db.internal:027017/A-z_9",
        "mongodb://db.internal:1,db.internal:65535/" + "d" * 63,
        "mongodb://db.internal/app?readPreferenceTags=dc:eu,rack:1&readPreferenceTags="
        "&authSource=$external&tlsCAFile=/etc/ssl/ca.pem&appName=a%20b",
    ], [
        "mongodb://db.internal:27017", "mongodb://db.internal/", "mongodb://db.internal/a.b",
        "mongodb://db.internal/" + "d" * 64, "mongodb://db.internal/a$b",
        "mongodb://db.internal:0/app", "mongodb://db.internal:65536/app",
        "mongodb://db.internal:/app", "mongodb://db.internal:x/app",
        "mongodb://db1.internal,,db2.internal/app", "mongodb://db1.internal,/app",
        "mongodb:///app", "mongodb://-db.internal/app", "mongodb://db..internal/app",
        "mongodb://db.internal./app",
        "mongodb+srv://cluster0.example.net:27017/app",
        "mongodb+srv://a.example.net,b.example.net/app",
        "mongodb://db.internal/app?", "mongodb://db.internal/app?tls",
        "mongodb://db.internal/app?=x", "mongodb://db.internal/app?a=1&&b=2",
        "mongodb://db.internal/app?a=1&", "mongodb://db.internal/app#x",
        "mongodb://db.internal/app?a=1#x", "mongodb://db .internal/app",
        "mongodb://db.internal/app?a= b", "mongodb://db.internal/a\nb",
        "mongodb://[::1::2]/app", "mongodb://@db.internal/app",
    ], [
        "mongodb://[2001:db8::7]:27017/app",  # IPv6: the egress rule takes IPv4 CIDRs
        "mongodb://svc:s3cret@db.internal/app",  # credentials: leader_backend_secret_arn
        "mongodb://db.internal/my+db", "mongodb://db.internal/my%41db",  # the database
        "mongodb://db.internal/app?[x]=1",  # option names: letters, digits, _ . -
        "mongodb://db.internal/app\n",  # the worker strips surrounding space
    ]),
    "sink": (worker_takes_sink, [
        "mongodb://db1.internal:27017,db2.internal/app.events"
        "?replicaSet=rs0&checkpoints=streamlease_checkpoints&transactions=on",
        "mongodb+srv://cluster0.ab1cd.mongodb.net/app.events.v2",
        "mongodb://10.0.3.7/app.System.x",
        "mongodb://10.0.0.5/" + "d" * 63 + "." + "c" * 191,
        "mongodb://db.internal/a." + "c" * 253,
    ], [
        "mongodb://db.internal/app", "mongodb://db.internal/app.",
        "mongodb://db.internal/.events", "mongodb://db.internal/app.system.users",
        "mongodb://db.internal/app.ev$nts", "mongodb://db.internal/a." + "c" * 254,
        "mongodb://10.0.0.5/" + "d" * 63 + "." + "c" * 192,
        "mongodb://db.internal/" + "d" * 64 + ".events",
        "mongodb+srv://a.example.net,b.example.net/app.events",
        "mongodb+srv://cluster0.example.net:27017/app.events",
        "mongodb://db.internal:0/app.events", "mongodb:///app.events",
        "mongodb://db.internal/app.events#x", "mongodb://db.internal/app events",
    ], [
        "mongodb://[2001:db8::7]/app.events",
        "mongodb://%2Ftmp%2Fmongodb-27017.sock/app.events",  # a socket: not on ECS
        "mongodb://db.internal/app.a/b", "mongodb://db.internal/app.ev%41",
        "mongodb://svc:s3cret@db.internal/app.events",  # credentials: sink_secret_arn
    ]),
}


@pytest.mark.parametrize("variable", sorted(MONGODB_URLS))
def test_the_mongodb_patterns_decide_as_the_worker(module: StaticModule, variable: str) -> None:
    accepts = mongodb_rule(module, variable)
    worker, both, neither, narrower = MONGODB_URLS[variable]
    for url in both:
        assert accepts(url) and worker(url), (url, accepts(url), worker(url))
    for url in neither:
        assert not accepts(url) and not worker(url), (url, accepts(url), worker(url))
    for url in narrower:  # terraform refuses on purpose what the worker would take
        assert not accepts(url) and worker(url), (url, accepts(url), worker(url))


def mutated_mongodb_urls(seed: int, count: int, collection: bool) -> list[str]:
    """MongoDB URLs put together from parts, each valid or (one time in six) broken:
    scheme, hosts with ports, the separator, database (and collection), query."""
    rng = random.Random(seed)
    parts: dict[str, tuple[list[str], list[str]]] = {
        "scheme": (["mongodb", "MongoDB", "mongodb+srv", "mongodb+SRV"],
                   ["mongo", "mongodb+srv2", "mongodb "]),
        "host": (["db.internal", "10.0.3.7", "a", "A-1.b_2", "x" * 63],
                 ["-a", "a-", "a..b", ".a", "a.", "", "[::1]", "[2001:db8::7]", "[::1",
                  "::1", "x" * 64, "d b", "u:p@h", "@h", "h%2F", "h/x"]),
        "port": (["", "", ":27017", ":027017", ":1", ":65535", ":" + "0" * 8 + "1"],
                 [":65536", ":0", ":", ":x", ":-1", ":1e3"]),
        "slash": (["/"], ["", "//", "/?"]),
        "name": (["app", "a-b_C9", "d" * 63], ["", "d" * 64, "a.b", "a$b", "a b", "a%41",
                                               "a/b", "a\\b", "é", "a*", "a:b", "a#b"]),
        "collection": (["events", "a.b", "System.x", "c" * 191],
                       ["", "system.users", "e$v", "c" * 192, "a/b", "e v", "e#v", "e\x00v"]),
        "query": (["", "?a=1", "?a=1&b=2", "?a=$x:y,z/1", "?a=b=c", "?a=%20", "?a=",
                   "?replicaSet=rs0&tls=true"],
                  ["?", "?a", "?=1", "?a=1&", "?a=1&&b=2", "#f", "?a=1#f", "?a= b", "?a=\t",
                   "?a=é"]),
    }

    def pick(part: str) -> str:
        good, bad = parts[part]
        return rng.choice(bad if rng.random() < 1 / 6 else good)

    urls = []
    for _ in range(count):
        hosts = ",".join(pick("host") + pick("port") for _ in range(rng.choice([1, 1, 2, 3])))
        path = pick("name") + ("." + pick("collection") if collection else "")
        urls.append(f"{pick('scheme')}://{hosts}{pick('slash')}{path}{pick('query')}")
    return urls


@pytest.mark.parametrize("variable", sorted(MONGODB_URLS))
def test_the_mongodb_patterns_take_nothing_the_worker_refuses(module: StaticModule,
                                                              variable: str) -> None:
    accepts = mongodb_rule(module, variable)
    worker = MONGODB_URLS[variable][0]
    urls = mutated_mongodb_urls(20261205, 6000, collection=variable == "sink")
    taken = [u for u in urls if accepts(u)]
    wrong = [u for u in taken if not worker(u)]
    assert not wrong, f"terraform would let through what the worker refuses: {wrong[:5]}"
    # Both outcomes occur often enough for the check to mean something.
    refused_by_worker = sum(not worker(u) for u in urls)
    assert len(taken) >= len(urls) // 10 and refused_by_worker >= len(urls) // 4, \
        (len(taken), refused_by_worker)


# --- tables -----------------------------------------------------------------------------


def as_create_table(values: dict[str, Any]) -> dict[str, Any]:
    """A planned aws_dynamodb_table in the shape of CreateTable's arguments (indexes and
    projected attributes in name order: terraform keeps them as sets)."""
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
        projection: dict[str, Any] = {"ProjectionType": gsi["projection_type"]}
        if gsi.get("non_key_attributes"):
            projection["NonKeyAttributes"] = sorted(gsi["non_key_attributes"])
        indexes.append({"IndexName": gsi["name"], "KeySchema": index_keys,
                        "Projection": projection})
    if indexes:
        out["GlobalSecondaryIndexes"] = sorted(indexes, key=lambda i: i["IndexName"])
    if values.get("stream_enabled"):
        out["StreamSpecification"] = {"StreamEnabled": True,
                                      "StreamViewType": values["stream_view_type"]}
    return out


def sorted_definition(definition: dict[str, Any]) -> dict[str, Any]:
    """streamlease/store/schema.py's CreateTable arguments in the same order as above."""
    out = {**definition, "AttributeDefinitions": sorted(
        definition["AttributeDefinitions"], key=lambda a: a["AttributeName"])}
    if "GlobalSecondaryIndexes" in definition:
        indexes = []
        for index in definition["GlobalSecondaryIndexes"]:
            projection = dict(index["Projection"])
            if "NonKeyAttributes" in projection:
                projection["NonKeyAttributes"] = sorted(projection["NonKeyAttributes"])
            indexes.append({**index, "Projection": projection})
        out["GlobalSecondaryIndexes"] = sorted(indexes, key=lambda i: i["IndexName"])
    return out


def table_create_definitions() -> dict[str, dict[str, Any]]:
    """What `streamlease table create` creates, by table name: the streams table with its
    DynamoDB stream, the events and fleet tables (definitions() sends nothing)."""
    admin = DynamoAdmin(None, DEFAULTS["STREAMLEASE_TABLE"],  # type: ignore[arg-type]
                        DEFAULTS["STREAMLEASE_EVENTS_TABLE"], DEFAULTS["STREAMLEASE_FLEET_TABLE"])
    return {d["TableName"]: d for d in admin.definitions()}


TABLE_CREATE = table_create_definitions()


@pytest.mark.parametrize(("name", "expected"), [
    ("streams", TABLE_CREATE[DEFAULTS["STREAMLEASE_TABLE"]]),
    ("events", TABLE_CREATE[DEFAULTS["STREAMLEASE_EVENTS_TABLE"]]),
    ("fleet", TABLE_CREATE[DEFAULTS["STREAMLEASE_FLEET_TABLE"]]),
])
def test_tables_are_the_worker_schema(module_plans: dict[str, Any], name: str,
                                      expected: dict[str, Any]) -> None:
    """Keys, indexes, projections and the streams table's DynamoDB stream (the change
    feed's, NEW_AND_OLD_IMAGES) as `table create` makes them."""
    values = planned(module_plans["defaults"])[f"aws_dynamodb_table.{name}"]
    assert as_create_table(values) == sorted_definition(expected)


def test_without_the_change_feed_the_streams_table_has_no_stream(
        module_plans: dict[str, Any]) -> None:
    """change_feed = false: the same table, without its DynamoDB stream; the other tables
    never have one."""
    values = planned(module_plans["no_change_feed"])
    streams = values["aws_dynamodb_table.streams"]
    assert streams["stream_enabled"] is False, streams
    assert as_create_table(streams) == sorted_definition(
        schema.streams_table(DEFAULTS["STREAMLEASE_TABLE"]))
    assert schema.STREAM_SPECIFICATION == {"StreamEnabled": True,
                                           "StreamViewType": "NEW_AND_OLD_IMAGES"}
    for plan in ("defaults", "no_change_feed"):
        for name in ("events", "fleet"):
            assert not planned(module_plans[plan])[f"aws_dynamodb_table.{name}"][
                "stream_enabled"], (plan, name)


def test_orphan_index_never_holds_the_checkpoint() -> None:
    """The projection that keeps sink checkpoints off the hot index (compared with the
    plan above): last_seq is not projected."""
    from streamlease.store import codec

    assert codec.LAST_SEQ not in codec.INDEX_PROJECTED


def test_index_names_are_the_codec_s(module_plans: dict[str, Any]) -> None:
    from streamlease.store import codec

    outputs = planned_outputs(module_plans["defaults"])
    assert outputs["streams_index_name"] == codec.INDEX_NAME
    assert outputs["owner_index_name"] == codec.OWNER_INDEX_NAME


def test_table_names_follow_the_inputs(module_plans: dict[str, Any]) -> None:
    values = planned(module_plans["fleet"])
    assert values["aws_dynamodb_table.fleet"]["name"] == "acme-fleet"
    assert environment(module_plans["fleet"])["STREAMLEASE_FLEET_TABLE"] == "acme-fleet"


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
    outputs = planned_outputs(plan)
    streams = values["aws_dynamodb_table.streams"]["arn"]
    return {
        "streams": streams,
        "index": f"{streams}/index/{outputs['streams_index_name']}",
        "owner_index": f"{streams}/index/{outputs['owner_index_name']}",
        "events": values["aws_dynamodb_table.events"]["arn"],
        "fleet": values["aws_dynamodb_table.fleet"]["arn"],
        "logs": values["aws_cloudwatch_log_group.worker"]["arn"],
    }


def key_attributes(definition: dict[str, Any]) -> set[str]:
    keys = {k["AttributeName"] for k in definition["KeySchema"]}
    for index in definition.get("GlobalSecondaryIndexes", []):
        keys |= {k["AttributeName"] for k in index["KeySchema"]}
    return keys


NONE: frozenset[Condition] = frozenset()
IN_TRANSACTIONS: Condition = ("StringEquals", "dynamodb:EnclosingOperation",
                              ("TransactWriteItems",))
IN_REGION: Condition = ("StringEquals", "aws:RequestedRegion", ("eu-west-1",))  # the mock's


def attributes_in(names: set[str] | frozenset[str]) -> Condition:
    return ("ForAllValues:StringEquals", "dynamodb:Attributes", tuple(sorted(names)))


def partitions_in(*patterns: str) -> Condition:
    return ("ForAllValues:StringLike", "dynamodb:LeadingKeys", tuple(sorted(patterns)))


def derived_grants(needs: store_calls.Needs, arn: dict[str, str], job_write_arns: list[str],
                   stream_attribute_list: bool) -> Grants:
    """The grants the module's rules give for what the code sends:
    - every action on the table or index it is sent to, nothing more;
    - an action sent only inside transactions: dynamodb:EnclosingOperation;
    - the worker's streams UpdateItem: dynamodb:Attributes, the attributes it names plus
      every key attribute of the table and its indexes (the IAM documentation's rule);
    - a write to the fleet table: dynamodb:LeadingKeys, the partitions it writes;
    - `job write`'s Put: on the tables job_write_table_arns names;
    - a DynamoDB Streams request: on the table's streams (TABLE/stream/*), but ListStreams,
      for which IAM defines no resource type, on "*" in the task's region."""
    out: Grants = {}
    unscoped = {store_calls.iam_action(o) for o in store_calls.UNSCOPED_OPERATIONS}
    streams = {store_calls.iam_action(o) for o in store_calls.STREAM_OPERATIONS}
    for (table, index), actions in needs.resources().items():
        if table == store_calls.JOB_WRITE:
            resources = job_write_arns
        else:
            resources = [arn[table] if index is None else f"{arn[table]}/index/{index}"]
        for action, usage in actions.items():
            conditions: set[Condition] = set()
            if action in unscoped:
                out.setdefault("*", {})[action] = frozenset({IN_REGION})
                continue
            if action in streams:
                out.setdefault(f"{arn[table]}/stream/*", {})[action] = NONE
                continue
            if usage.transaction_only:
                conditions.add(IN_TRANSACTIONS)
            if stream_attribute_list and table == store_calls.STREAMS \
                    and action == "dynamodb:UpdateItem":
                conditions.add(attributes_in(
                    usage.attributes | key_attributes(schema.streams_table("any"))))
            if table == store_calls.FLEET and action in store_calls.WRITE_ACTIONS:
                assert usage.partitions is not None, (table, action)
                conditions.add(partitions_in(*usage.partitions))
            for resource in resources:
                out.setdefault(resource, {})[action] = frozenset(conditions)
    return out


def worker_needs(sink_kind: str = "dynamodb", change_feed: bool = True) -> store_calls.Needs:
    """What the task role's code sends to DynamoDB with this STREAMLEASE_SINK kind: with
    any kind but dynamodb the worker's sink is a processor (app.worker_sink), so nothing
    reaches the events-table sink (test_only_the_dynamodb_sink_is_the_events_table).
    With the change feed on (the module's change_feed, its default), every request of
    the feed's store classes (test_the_worker_reaches_every_change_feed_request); off,
    none of them (the worker builds no reader with STREAMLEASE_CHANGE_FEED=off)."""
    skip = frozenset() if sink_kind == "dynamodb" else frozenset({store_calls.EVENTS_SINK_ROLE})
    called, puts = store_calls.calls_in(store_calls.task_sources(), skip_roles=skip)
    called = {m for m in called if m[0] not in store_calls.FEED_CLASSES}
    if change_feed:
        called |= store_calls.feed_methods()
    names = {m for _, m in called}
    assert {"acquire", "renew", "release", "orphans", "adopt", "check_tables",
            "register", "heartbeat", "members", "fenced_write", "claim_write",
            "checkpoint"} <= names, f"worker methods found: {sorted(called)}"
    assert ("write_batch" in names) == (sink_kind == "dynamodb"), sorted(called)
    return store_calls.needs(called, puts)


def operator_needs() -> store_calls.Needs:
    called, puts = store_calls.calls_in(store_calls.operator_sources())
    return store_calls.needs(called, puts)


# Store methods that neither `streamlease run` nor an operator command reaches (calls, or
# reaches through a method it calls: DynamoAdmin.definitions through create_tables and
# check_tables, the feed's checkpoint store through its reader), and why. A method missing
# from both is either called through a receiver store_calls.ROLES does not know (then the
# IAM comparison would miss it) or belongs here.
NOT_CALLED = {
    ("DynamoAdmin", "event_fences"): "the sink audit of the tests and the load test",
    ("DynamoAdmin", "put_item"): "test harnesses writing items as an operator would by hand",
}


def test_every_store_method_is_called_or_explained() -> None:
    stores = store_calls.store_classes()
    task, _ = store_calls.calls_in(store_calls.task_sources())
    operator, _ = store_calls.calls_in(store_calls.operator_sources())
    left = stores.public_methods() - store_calls.reachable(task) - \
        store_calls.reachable(operator)
    assert left == set(NOT_CALLED), (
        f"store methods no command calls: {sorted(left - set(NOT_CALLED))}; "
        f"listed as not called but called: {sorted(set(NOT_CALLED) - left)}")


def test_the_worker_reaches_every_change_feed_request() -> None:
    """The feed's reader is built outside connect() (app.py, under each leader term's
    fence): the worker's code reaches every method of the feed's store classes, the
    checkpoint store's through the reader's ``checkpoints``. So worker_needs(change_feed)
    is what `streamlease run` sends with the feed on."""
    task, _ = store_calls.calls_in(store_calls.task_sources())
    left = store_calls.feed_methods() - store_calls.reachable(task)
    assert not left, f"change-feed store methods the worker does not reach: {sorted(left)}"
    reader = {m for m in store_calls.feed_methods() if m[0] == "ChangeFeedReader"}
    assert store_calls.reachable(reader) >= store_calls.feed_methods()


def test_store_operations_are_the_known_set() -> None:
    """A new DynamoDB call anywhere in streamlease/store/ must come with an IAM review."""
    stores = store_calls.store_classes()
    every = store_calls.needs(stores.public_methods() | store_calls.feed_methods(), [
        store_calls.Request("dynamodb:PutItem", store_calls.JOB_WRITE, None, True, "any")])
    assert every.iam_actions() == {
        "dynamodb:BatchGetItem",  # the holders' batched check-in
        "dynamodb:ConditionCheckItem", "dynamodb:CreateTable", "dynamodb:DeleteItem",
        "dynamodb:DescribeTable", "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:Query",
        "dynamodb:Scan", "dynamodb:UpdateItem", "dynamodb:UpdateTable",
        "dynamodb:DescribeTimeToLive", "dynamodb:UpdateTimeToLive",
        # the change feed: the streams table's stream
        "dynamodb:ListStreams", "dynamodb:DescribeStream", "dynamodb:GetShardIterator",
        "dynamodb:GetRecords"}
    stream_actions = {r.action: r.table for r in every.requests
                      if r.action in {store_calls.iam_action(o)
                                      for o in store_calls.STREAM_OPERATIONS}}
    assert set(stream_actions.values()) == {store_calls.STREAMS}, stream_actions
    in_transactions = {(r.table, r.action) for r in every.requests if r.in_transaction}
    assert in_transactions == {
        ("streams", "dynamodb:UpdateItem"),  # the sink's checkpoint
        ("events", "dynamodb:PutItem"),  # the sink's events
        ("fleet", "dynamodb:ConditionCheckItem"),  # every fenced write's check
        ("fleet", "dynamodb:PutItem"),  # a slot claim, fenced
        ("fleet", "dynamodb:UpdateItem"),  # a leader acquisition with its fence mark
        ("job_write", "dynamodb:PutItem"),  # `job write`
    }, in_transactions


def test_nothing_builds_an_arbitrary_transaction() -> None:
    """``streamlease.leader.Transaction`` carries actions of its caller's choosing, which
    store_calls cannot read: the worker and its commands must not build one (the IAM
    comparison would not see its actions)."""
    import ast

    found = [f"{p.relative_to(ROOT)}:{n.lineno}" for p in (ROOT / "streamlease").rglob("*.py")
             for n in ast.walk(ast.parse(p.read_text()))
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
             and n.func.id == "Transaction"]
    assert not found, found


def test_the_worker_updates_only_lease_and_error_attributes() -> None:
    """The streams attributes a worker's UpdateItem may name (the task role allows no
    others): a change here is a change to the IAM policy (iam.tf
    local.worker_stream_attributes)."""
    needs = worker_needs()
    assert {u.table for u in needs.updates} == {"streams", "fleet"}, needs.updates
    # trace_parent: a release with tracing on stores the releasing span's context;
    # clean_release: a drained holder's release leaves its mark for the next holder;
    # handover_declined: a taker's no to a live hand-over, under the holder's fence.
    known = {"Pk", "desired_state", "lease_owner", "lease_expires_at_ms", "fence", "last_seq",
             "last_error", "last_error_at_ms", "lease_epoch", "trace_parent", "clean_release",
             "handover_declined"}
    new = [f"{u.where}: {sorted((u.attributes or set()) - known)}" for u in needs.updates
           if u.table == "streams" and (u.attributes or set()) - known]
    assert not new, "worker UpdateItems name attributes the task role does not allow:\n" \
        + "\n".join(new)
    assert needs.updated_attributes("streams") == known


def test_the_worker_never_writes_a_job() -> None:
    """Jobs (Pk JOB) hold commands every leader runs: only operators write them. The
    worker's fleet-table writes (and so the task role's LeadingKeys) never name JOB."""
    for request in worker_needs().requests:
        if request.table == "fleet" and request.action in store_calls.WRITE_ACTIONS:
            assert request.partitions and fleetcodec.JOB_PK not in request.partitions, request
            assert all(p.startswith((fleetcodec.MEMBER_PK, fleetcodec.LEADER_PK,
                                     fleetcodec.RUN_PREFIX, feedcheckpoints.FEED_PK))
                       for p in request.partitions)


def test_the_change_feed_writes_only_its_checkpoints() -> None:
    """With the change feed on, the worker also puts and deletes the feed's checkpoints
    (Pk FEED) and reads the streams table's stream; off, neither."""
    def fleet_writes(needs: store_calls.Needs) -> dict[str, frozenset[str]]:
        out: dict[str, frozenset[str]] = {}
        for r in needs.requests:
            if r.table == "fleet" and r.action in store_calls.WRITE_ACTIONS:
                out[r.action] = out.get(r.action, frozenset()) | (r.partitions or frozenset())
        return out

    on, off = fleet_writes(worker_needs()), fleet_writes(worker_needs(change_feed=False))
    feed = feedcheckpoints.FEED_PK
    assert {a for a, p in on.items() if feed in p} == {"dynamodb:PutItem", "dynamodb:DeleteItem"}
    assert not any(feed in p for p in off.values()), off
    assert {a: p - {feed} for a, p in on.items()} == off
    streams = {store_calls.iam_action(o) for o in store_calls.STREAM_OPERATIONS}
    assert streams <= worker_needs().iam_actions()
    assert not streams & worker_needs(change_feed=False).iam_actions()


# (mongodb: a MongoDB leader backend adds no AWS grant.)
@pytest.mark.parametrize("plan_name", ["defaults", "fleet", "no_change_feed", "mongodb"])
def test_task_role_grants_exactly_what_the_worker_calls(module_plans: dict[str, Any],
                                                        plan_name: str) -> None:
    plan = module_plans[plan_name]
    arn = arns(plan)
    job_write = list(PLAN_RUNS[plan_name].get("job_write_table_arns", []))
    change_feed = PLAN_RUNS[plan_name].get("change_feed", True)
    feed = ("FEED",) if change_feed else ()  # the change feed's checkpoints
    # Every attribute a worker UpdateItem names, and every key attribute of the table
    # and its indexes.
    attributes = worker_needs().updated_attributes("streams") | key_attributes(
        schema.streams_table("any"))
    assert "ws_url" not in attributes  # only operators re-point a stream
    expected: Grants = {
        # check_tables; the check-in read (a holder confirming one item) and the batched
        # check-in (every held item, while the change feed is not live); the sweep
        # (unindexed), which finds items without lease fields or with a bad
        # desired_state, which the sparse index cannot show; acquire, renew, release,
        # release_for, advance, adopt, record_error and the sink's checkpoint Update.
        arn["streams"]: {
            "dynamodb:DescribeTable": NONE,
            "dynamodb:GetItem": NONE,
            "dynamodb:BatchGetItem": NONE,
            "dynamodb:Scan": NONE,
            "dynamodb:UpdateItem": frozenset({attributes_in(attributes)}),
        },
        arn["index"]: {"dynamodb:Query": NONE},  # orphans, held STOPPED streams
        arn["owner_index"]: {"dynamodb:Query": NONE},  # a dead member's streams
        arn["events"]: {  # check_tables; the newest events item; the sink's Puts
            "dynamodb:DescribeTable": NONE,
            "dynamodb:Query": NONE,
            "dynamodb:PutItem": frozenset({IN_TRANSACTIONS}),
        },
        arn["fleet"]: {
            "dynamodb:DescribeTable": NONE,  # check_tables
            "dynamodb:GetItem": NONE,  # the leader lease
            "dynamodb:Query": NONE,  # members, jobs, runs
            "dynamodb:UpdateItem": frozenset({partitions_in("LEADER", "MEMBER", "MEMBER#*",
                                                            "RUN#*")}),
            # slot claims; the bulletin's replicas; the change feed's checkpoints
            "dynamodb:PutItem": frozenset({partitions_in("MEMBER", "MEMBER#*", "RUN#*",
                                                         *feed)}),
            # leave; forget a shard gone past retention
            "dynamodb:DeleteItem": frozenset({partitions_in("MEMBER", "MEMBER#*", *feed)}),
            "dynamodb:ConditionCheckItem": frozenset({  # fenced writes
                partitions_in("LEADER"), IN_TRANSACTIONS}),
        },
    }
    if change_feed:  # the leader tails the streams table's DynamoDB stream
        expected[f"{arn['streams']}/stream/*"] = dict.fromkeys(
            ["dynamodb:DescribeStream", "dynamodb:GetShardIterator", "dynamodb:GetRecords"],
            NONE)
        # ListStreams has no resource type in IAM: "*", in the task's region
        expected["*"] = {"dynamodb:ListStreams": frozenset({IN_REGION})}
    for table in job_write:  # `job write --table T`: with the fence check only
        expected[table] = {"dynamodb:PutItem": frozenset({IN_TRANSACTIONS})}
    granted = policy(plan, "task")
    assert not differences(granted, expected), "\n".join(differences(granted, expected))
    # ... and that is what the code that runs with the task role sends, by the rules
    # derived_grants states: the same resources, actions and conditions.
    derived = derived_grants(worker_needs(change_feed=change_feed), arn, job_write,
                             stream_attribute_list=True)
    assert not differences(derived, expected), (
        "the module's grants differ from what worker/ sends:\n"
        + "\n".join(differences(derived, expected)))


def test_operator_policy_covers_table_create_ctl_and_job(module_plans: dict[str, Any]
                                                         ) -> None:
    plan = module_plans["defaults"]
    arn = arns(plan)
    jobs_only = frozenset({partitions_in("JOB")})
    expected: Grants = {
        # table create (UpdateTable adds a missing index); ctl start/stop/show/release/
        # export, ctl list and ctl members (Scan).
        arn["streams"]: dict.fromkeys(["dynamodb:CreateTable", "dynamodb:DescribeTable",
                                       "dynamodb:GetItem", "dynamodb:Scan",
                                       "dynamodb:UpdateItem", "dynamodb:UpdateTable"], NONE),
        # table create (and its TTL on expires_at); ctl export.
        arn["events"]: dict.fromkeys(["dynamodb:CreateTable", "dynamodb:DescribeTable",
                                      "dynamodb:DescribeTimeToLive", "dynamodb:Query",
                                      "dynamodb:UpdateTimeToLive"], NONE),
        # table create; ctl members, job list/runs (Query), job runs (GetItem); job put
        # and job remove, on job items only.
        arn["fleet"]: {**dict.fromkeys(["dynamodb:CreateTable", "dynamodb:DescribeTable",
                                        "dynamodb:GetItem", "dynamodb:Query"], NONE),
                       "dynamodb:PutItem": jobs_only, "dynamodb:DeleteItem": jobs_only},
    }
    granted = policy(plan, "operator")
    assert not differences(granted, expected), "\n".join(differences(granted, expected))
    derived = derived_grants(operator_needs(), arn, [], stream_attribute_list=False)
    assert not differences(derived, expected), (
        "the operator policy differs from what streamlease/cli.py and streamlease/jobcli.py send:\n"
        + "\n".join(differences(derived, expected)))


@pytest.mark.parametrize("name", ["task", "operator"])
def test_dynamodb_policies_have_no_wildcards(module_plans: dict[str, Any], name: str) -> None:
    """No wildcard action, and no wildcard resource but the change feed's two: ListStreams,
    which IAM authorises only on "*", and the streams table's streams, whose label
    changes each time the stream is turned on."""
    plan = module_plans["defaults"]
    stream_arns = f"{arns(plan)['streams']}/stream/*"
    for resource, actions in policy(plan, name).items():
        assert all("*" not in a for a in actions), resource
        if resource == "*":
            assert name == "task" and set(actions) == {"dynamodb:ListStreams"}, actions
        elif resource == stream_arns:
            assert name == "task" and set(actions) == {
                "dynamodb:DescribeStream", "dynamodb:GetShardIterator", "dynamodb:GetRecords"}
        else:
            assert "*" not in resource, resource


def test_execution_role_pulls_only_its_image_and_writes_only_its_logs(
        module_plans: dict[str, Any]) -> None:
    plan = module_plans["defaults"]
    logs = f"{arns(plan)['logs']}:*"
    write_logs = {"logs:CreateLogStream": NONE, "logs:PutLogEvents": NONE}
    ecr = {
        # derived from the ECR image's registry and repository
        "arn:aws:ecr:eu-west-1:123456789012:repository/streamlease": {
            "ecr:BatchGetImage": NONE, "ecr:GetDownloadUrlForLayer": NONE},
        # GetAuthorizationToken has no resource-level permission.
        "*": {"ecr:GetAuthorizationToken": NONE},
    }
    assert policy(plan, "execution") == {logs: write_logs, **ecr}
    custom = module_plans["custom"]  # an image outside ECR: no ECR permissions at all
    assert policy(custom, "execution") == {f"{arns(custom)['logs']}:*": write_logs}
    fleet = module_plans["fleet"]  # the leader backend from a secret, under a customer key
    options = PLAN_RUNS["fleet"]
    assert policy(fleet, "execution") == {
        f"{arns(fleet)['logs']}:*": write_logs, **ecr,
        options["leader_backend_secret_arn"]: {"secretsmanager:GetSecretValue": NONE},
        options["leader_backend_secret_kms_key_arn"]: {"kms:Decrypt": frozenset({(
            "StringEquals", "kms:ViaService", ("secretsmanager.eu-west-1.amazonaws.com",))})},
    }


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


def containers(plan: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The task definition's containers by name, in their order."""
    found = json.loads(planned(plan)[TASK_DEFINITION]["container_definitions"])
    by_name = {c["name"]: c for c in found}
    assert len(by_name) == len(found), [c["name"] for c in found]
    return by_name


def container(plan: dict[str, Any]) -> dict[str, Any]:
    """The worker's container (the first: a sidecar comes after it)."""
    found = containers(plan)
    assert next(iter(found)) == "worker", list(found)
    return found["worker"]


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
    # A variable whose default is null leaves its setting out, so the worker's default
    # applies: the member lease and heartbeat (from the lease and heartbeat), the safety
    # margin (a tenth of the member lease), the minimum hold (1.5 member leases), the
    # stream renewal (a third of the stream lease), the dead letter (none), the profiles
    # file (none: the built-in profile only), the python upstream (none); so does the
    # change feed's switch while on (once the worker reads STREAMLEASE_CHANGE_FEED: on,
    # where the table has a stream).
    unset = {name for name, variable in cases.variable_of.items()
             if worker_cases.env_text(cases.kind[variable], cases.defaults.get(variable)) is None}
    assert unset == {"STREAMLEASE_SAFETY_MARGIN_SECONDS", "STREAMLEASE_MIN_HOLD_SECONDS",
                     "STREAMLEASE_STREAM_RENEW_SECONDS",
                     "STREAMLEASE_MEMBER_LEASE_SECONDS", "STREAMLEASE_MEMBER_HEARTBEAT_SECONDS",
                     "STREAMLEASE_DEAD_LETTER", "STREAMLEASE_PROFILES",
                     "STREAMLEASE_UPSTREAM"} | ({"STREAMLEASE_CHANGE_FEED"} & set(DEFAULTS)), unset
    assert "STREAMLEASE_CHANGE_FEED" not in env
    missing = set(cases.variable_of) - set(env) - unset
    assert not missing, f"not passed to the container (ecs.tf local.worker_settings): {missing}"
    assert not unset & set(env), unset & set(env)
    assert set(env) <= {s.name for s in SETTINGS}, set(env) - {s.name for s in SETTINGS}
    for name, text in env.items():
        assert text == DEFAULTS[name], f"{name}: the module writes {text!r}, the worker's " \
                                       f"default is {DEFAULTS[name]!r}"
    assert WorkerConfig.from_env(env) == WorkerConfig.from_env({})


def test_leader_backend_from_a_secret_never_enters_the_environment(
        module_plans: dict[str, Any]) -> None:
    plan = module_plans["fleet"]
    env = environment(plan)
    assert "STREAMLEASE_LEADER_BACKEND" not in env
    assert container(plan)["secrets"] == [{
        "name": "STREAMLEASE_LEADER_BACKEND",
        "valueFrom": PLAN_RUNS["fleet"]["leader_backend_secret_arn"]}]
    assert env["STREAMLEASE_METRICS_ADDRESS"] == "::"
    assert container(module_plans["defaults"])["secrets"] == []
    assert environment(module_plans["defaults"])["STREAMLEASE_LEADER_BACKEND"] == "dynamodb"


LEADER_URL_PLANS = {"redis": RedisTarget, "mongodb": MongoTarget, "mongodb_srv": MongoTarget}


@pytest.mark.parametrize("plan_name", sorted(LEADER_URL_PLANS))
def test_a_leader_backend_url_is_sensitive_in_the_plan(module_plans: dict[str, Any],
                                                       plan_name: str) -> None:
    """A plan shows the task definition's containers as (sensitive value) once the
    variable holds a Redis or MongoDB URL, and in full for the default backend. The URL
    reaches the environment as written, no secret, and the worker reads it as that
    backend's target."""
    def sensitive(plan: dict[str, Any]) -> Any:
        (change,) = [rc["change"] for rc in plan["resource_changes"]
                     if rc["address"] == TASK_DEFINITION]
        return (change.get("after_sensitive") or {}).get("container_definitions", False)

    plan = module_plans[plan_name]
    assert sensitive(plan) is True
    assert not sensitive(module_plans["defaults"])
    env = environment(plan)
    assert env["STREAMLEASE_LEADER_BACKEND"] == PLAN_RUNS[plan_name]["leader_backend"]
    assert container(plan)["secrets"] == []
    backend = WorkerConfig.from_env(env).leader_backend
    assert isinstance(backend, LEADER_URL_PLANS[plan_name]), backend


def egress_rules(plan: dict[str, Any]) -> dict[str, tuple[str, int, int, str]]:
    """The planned worker egress rules: key -> (CIDR, from port, to port, description)."""
    prefix = "aws_vpc_security_group_egress_rule.worker["
    return {address: (v["cidr_ipv4"], v["from_port"], v["to_port"], v["description"])
            for address, v in planned(plan).items() if address.startswith(prefix)}


def test_leader_backend_egress_opens_the_members_port(module_plans: dict[str, Any]) -> None:
    """leader_backend_egress adds one rule per CIDR on the backend's port, described as
    the leader backend's (Redis or MongoDB), to the rules the module has without it; the
    port is the one the worker dials (every host of the URL names it here)."""
    values = PLAN_RUNS["mongodb"]["leader_backend_egress"]
    added = set(egress_rules(module_plans["mongodb"]).values()) - set(
        egress_rules(module_plans["defaults"]).values())
    assert added == {(cidr, 27017, 27017, "Leader backend, Redis or MongoDB "
                      "(STREAMLEASE_LEADER_BACKEND)") for cidr in values["cidr_blocks"]}
    target = WorkerConfig.from_env(environment(module_plans["mongodb"])).leader_backend
    assert isinstance(target, MongoTarget)
    assert {h.rsplit(":", 1)[1] for h in target.hosts} == {str(values["port"])}
    assert set(egress_rules(module_plans["mongodb_srv"]).values()) == set(
        egress_rules(module_plans["defaults"]).values())  # no egress given, no rule added


def test_buffer_rule_is_the_worker_s(module: StaticModule) -> None:
    """ecs.tf's precondition computes one stream's buffers as per_frame_byte x
    max_frame_bytes + fixed: the same line as streamlease/core/stream.py."""
    locals_ = {}
    for path in sorted(MODULE_DIR.glob("*.tf")):
        for block in parse_hcl(path).get("locals", []):
            locals_.update(block)
    slope, fixed = locals_["stream_buffer_bytes_per_frame_byte"], \
        locals_["stream_buffer_bytes_fixed"]
    for frame in (1024, 262144, 300000):
        assert stream_buffer_bytes(frame) == slope * frame + fixed, frame


def test_task_environment_follows_the_inputs(module_plans: dict[str, Any]) -> None:
    env = environment(module_plans["custom"])
    assert env["STREAMLEASE_LEASE_SECONDS"] == "9"
    assert env["STREAMLEASE_HEARTBEAT_SECONDS"] == "2.5"
    assert env["STREAMLEASE_SAFETY_MARGIN_SECONDS"] == "1.5"
    assert env["STREAMLEASE_MEMBER_LEASE_SECONDS"] == "12"
    assert env["STREAMLEASE_MEMBER_HEARTBEAT_SECONDS"] == "3"
    assert env["STREAMLEASE_ALLOWED_URLS"] == "wss://a.example/,ws://b.example/"
    assert env["STREAMLEASE_METRICS_PORT"] == "9200"
    assert env["STREAMLEASE_LOG_LEVEL"] == "debug"
    config = WorkerConfig.from_env(env)
    assert (config.timings.lease_s, config.timings.heartbeat_s,
            config.timings.safety_margin_s) == (12, 3, 1.5)
    # Without the member settings the member lease is the smaller of 5 s and the lease.
    assert environment(module_plans["defaults"]).keys().isdisjoint(
        {"STREAMLEASE_MEMBER_LEASE_SECONDS", "STREAMLEASE_MEMBER_HEARTBEAT_SECONDS"})
    assert [rule.entry for rule in config.allowed_urls] == ["wss://a.example/", "ws://b.example/"]


def test_the_change_feed_switch_enters_the_environment_only_when_off(
        module_plans: dict[str, Any]) -> None:
    """change_feed = false writes STREAMLEASE_CHANGE_FEED=off and changes nothing else in
    the environment; on (the default) leaves it out, the worker's default."""
    on, off = environment(module_plans["defaults"]), environment(module_plans["no_change_feed"])
    assert "STREAMLEASE_CHANGE_FEED" not in on
    assert off.pop("STREAMLEASE_CHANGE_FEED") == "off"
    assert off == on
    if "STREAMLEASE_CHANGE_FEED" in DEFAULTS:  # the worker reads the switch
        assert DEFAULTS["STREAMLEASE_CHANGE_FEED"] == "on"
        WorkerConfig.from_env(environment(module_plans["no_change_feed"]))


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
    # /healthz fails once the member heartbeat or a held stream is older than the member
    # lease (app.py's HealthState); ECS gives the worker at least one more member lease to
    # recover (a DynamoDB blip stalls every worker at once) before it replaces the task.
    # The member lease as the worker computes it from the planned environment (5 s: the
    # smaller of config.MEMBER_LEASE_S and STREAMLEASE_LEASE_SECONDS), and as set.
    for plan in ("defaults", "custom"):
        member_lease = WorkerConfig.from_env(environment(module_plans[plan])).timings.lease_s
        assert check["interval"] * check["retries"] >= member_lease, plan
    assert container(module_plans["custom"])["healthCheck"] == check
    assert DEFAULTS["STREAMLEASE_LOG_FORMAT"] == "json"  # what CloudWatch Logs Insights reads
    assert container(module_plans["custom"])["portMappings"][0]["containerPort"] == 9200


# --- sinks: the task role's grants for each kind, the secrets ---------------------------------

SINK_PLANS = ["defaults", "kinesis", "sqs", "mongodb_sink", "sink_secrets"]


def test_sink_kinds_table_is_the_module_s() -> None:
    """sink_calls.KIND_ACTIONS names every kind the worker parses, and sinks.tf grants
    the same actions for the same kinds."""
    sink_calls.assert_table_covers_every_kind()
    locals_: dict[str, Any] = {}
    for block in parse_hcl(MODULE_DIR / "sinks.tf").get("locals", []):
        locals_.update(block)
    module_table = {k: frozenset(literal(v)) for k, v in
                    literal(locals_["sink_kind_actions"]).items()}
    assert module_table == {k: v for k, v in sink_calls.KIND_ACTIONS.items() if v}


@pytest.mark.parametrize("kind", sorted(sink_calls.KIND_ACTIONS))
def test_sink_kinds_table_is_what_the_outputs_call(kind: str) -> None:
    """Each output module's AWS client calls, by botocore's model of the kind's service,
    are the table's actions for that kind; outputs that are not AWS services call none:
    they import no AWS SDK (a `client` of theirs, such as pymongo's, is not an AWS one)."""
    if kind in ("dynamodb", "python"):  # the events table (store_calls); the user's code
        assert sink_calls.module_path(kind) is None and not sink_calls.KIND_ACTIONS[kind]
        return
    path = sink_calls.module_path(kind)
    if path is None:
        pytest.skip(f"the {kind} output ({sink_calls.output_modules()[kind]}.py) is not in "
                    "this tree")
    if kind in sink_calls.AWS_KINDS:
        assert sink_calls.aws_sdk_imports(path)  # what the other kinds' check looks for
        assert sink_calls.aws_actions(path)[kind] == sink_calls.KIND_ACTIONS[kind]
    else:
        assert not sink_calls.aws_sdk_imports(path), sink_calls.aws_sdk_imports(path)


def test_only_the_dynamodb_sink_is_the_events_table() -> None:
    """app.py hands the store's events-table sink to the worker only for the dynamodb
    kind: the premise of worker_needs(kind) dropping the sink's calls otherwise."""
    import ast

    tree = ast.parse((ROOT / "streamlease" / "app.py").read_text())
    uses = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "sink"
            and isinstance(n.value, ast.Name) and n.value.id == "stores"]
    guarded = [n for node in ast.walk(tree) if isinstance(node, ast.If)
               and ast.unparse(node.test) == "config.sink.kind == 'dynamodb'"
               for stmt in node.body for n in ast.walk(stmt) if n in uses]
    assert uses and len(guarded) == len(uses), [ast.unparse(n) for n in uses]


def output_grants(plan_values: dict[str, Any], output: str, partition: str = "aws",
                  region: str = "eu-west-1", account: str = "123456789012") -> Grants:
    """The grants one output needs, from the worker's own parse of its URL (or, for a
    secret-held one, the kind and resources the operator states)."""
    if plan_values.get(f"{output}_secret_arn"):
        kind = plan_values[f"{output}_kind"]
        arns = list(plan_values.get(f"{output}_resource_arns", []))
    else:
        url = plan_values.get(output, DEFAULTS[f"STREAMLEASE_{output.upper()}"])
        if not url:
            return {}
        spec = parse_sink(url)
        kind = spec.kind
        arns = {
            "kinesis": [f"arn:{partition}:kinesis:{region}:{account}:stream/{spec.target}"],
            "sqs": [f"arn:{partition}:sqs:{region}:{account}:{spec.target}"],
            "s3": [f"arn:{partition}:s3:::{spec.target}/"
                   + (f"{spec.prefix}/" if spec.prefix else "") + "*"],
        }.get(kind, [])
    return {arn: dict.fromkeys(sink_calls.KIND_ACTIONS[kind], NONE) for arn in arns}


@pytest.mark.parametrize("plan_name", SINK_PLANS)
def test_task_role_grants_what_the_sink_calls(module_plans: dict[str, Any],
                                              plan_name: str) -> None:
    """The task role: the DynamoDB calls of the worker with this sink kind (the events
    table's sink calls only for dynamodb), and each AWS output's calls on its resources."""
    plan = module_plans[plan_name]
    values = PLAN_RUNS[plan_name]
    kind = values["sink_kind"] if values.get("sink_secret_arn") else \
        parse_sink(values.get("sink", DEFAULTS["STREAMLEASE_SINK"])).kind
    expected = derived_grants(worker_needs(kind), arns(plan), [], stream_attribute_list=True)
    for output in ("sink", "dead_letter"):
        for resource, actions in output_grants(values, output).items():
            expected.setdefault(resource, {}).update(actions)
    granted = policy(plan, "task")
    assert not differences(granted, expected), "\n".join(differences(granted, expected))
    if kind != "dynamodb":
        assert "dynamodb:PutItem" not in granted[arns(plan)["events"]]


def test_sinks_from_secrets_never_enter_the_environment(module_plans: dict[str, Any]) -> None:
    plan = module_plans["sink_secrets"]
    values = PLAN_RUNS["sink_secrets"]
    env = environment(plan)
    assert "STREAMLEASE_SINK" not in env and "STREAMLEASE_DEAD_LETTER" not in env
    assert sorted(container(plan)["secrets"], key=lambda s: s["name"]) == [
        {"name": "STREAMLEASE_DEAD_LETTER", "valueFrom": values["dead_letter_secret_arn"]},
        {"name": "STREAMLEASE_SINK", "valueFrom": values["sink_secret_arn"]}]
    execution = policy(plan, "execution")
    assert execution[values["sink_secret_arn"]] == {"secretsmanager:GetSecretValue": NONE}
    assert execution[values["dead_letter_secret_arn"]] == {"ssm:GetParameters": NONE}
    assert execution[values["sink_secrets_kms_key_arn"]] == {"kms:Decrypt": frozenset({(
        "StringEquals", "kms:ViaService",
        ("secretsmanager.eu-west-1.amazonaws.com", "ssm.eu-west-1.amazonaws.com"))})}
    # Named by URL: in the environment (sensitive in the plan), no secrets.
    for name in ("kinesis", "sqs"):
        env = environment(module_plans[name])
        assert env["STREAMLEASE_SINK"] == PLAN_RUNS[name]["sink"]
        assert env["STREAMLEASE_DEAD_LETTER"] == PLAN_RUNS[name]["dead_letter"]
        assert container(module_plans[name])["secrets"] == []
    assert environment(module_plans["sqs"])["STREAMLEASE_PROCESS_MAX_ATTEMPTS"] == "3"


# --- upstream profiles: the settings, the secrets their templates read ----------------------

PROFILES = PLAN_RUNS["profiles"]


def secret_of(value_from: str) -> str:
    """The secret an ECS valueFrom names: its ARN without :JSON_KEY:VERSION_STAGE:VERSION_ID
    (a secret's name has no colon, so the ARN is the first seven fields)."""
    return ":".join(value_from.split(":")[:7])


def via_secrets_manager(*regions: str) -> Condition:
    return ("StringEquals", "kms:ViaService",
            tuple(sorted(f"secretsmanager.{r}.amazonaws.com" for r in regions)))


def test_profile_settings_enter_the_environment_only_when_set(
        module_plans: dict[str, Any]) -> None:
    env = environment(module_plans["profiles"])
    assert env["STREAMLEASE_PROFILES"] == PROFILES["profiles_path"]
    assert env["STREAMLEASE_DEFAULT_PROFILE"] == PROFILES["default_profile"]
    assert env["STREAMLEASE_UPSTREAM"] == PROFILES["upstream"]
    assert not set(PROFILES["profile_env_secrets"]) & set(env)  # ECS secrets, not plain env
    # What the worker makes of that environment, in an image whose profiles file
    # defines the default profile (worker_cases.ImageFiles).
    config = WorkerConfig.from_env(worker_cases.IMAGE.env(env))
    assert config.default_profile == "gateway" and "gateway" in config.all_profiles
    assert config.upstream == PROFILES["upstream"]
    defaults = environment(module_plans["defaults"])
    assert "STREAMLEASE_PROFILES" not in defaults and "STREAMLEASE_UPSTREAM" not in defaults
    assert defaults["STREAMLEASE_DEFAULT_PROFILE"] == DEFAULTS["STREAMLEASE_DEFAULT_PROFILE"]


def test_profile_env_secrets_are_the_container_s_secrets(module_plans: dict[str, Any]) -> None:
    """Each NAME => ARN of profile_env_secrets is an ECS secret of the container, as given
    (a JSON key included), so ${env:NAME} finds it; nothing else is."""
    secrets = sorted(container(module_plans["profiles"])["secrets"], key=lambda s: s["name"])
    assert secrets == [{"name": name, "valueFrom": arn}
                       for name, arn in sorted(PROFILES["profile_env_secrets"].items())]


@pytest.mark.parametrize("plan_name", sorted(PLAN_RUNS))
def test_no_name_is_both_in_the_environment_and_a_secret(module_plans: dict[str, Any],
                                                         plan_name: str) -> None:
    names = [s["name"] for s in container(module_plans[plan_name])["secrets"]]
    assert len(names) == len(set(names)), names
    assert not set(names) & set(environment(module_plans[plan_name])), names


def test_the_worker_fetches_secrets_with_get_secret_value_only() -> None:
    """The task role's profile grant is the action of every Secrets Manager call in
    streamlease/secrets.py, read from the code and botocore's model of the service."""
    import botocore.session
    from botocore import xform_name

    model = botocore.session.get_session().get_service_model("secretsmanager")
    operations = {xform_name(op): op for op in model.operation_names}
    calls = sink_calls.client_calls(ROOT / "streamlease" / "secrets.py")
    assert calls and calls <= set(operations), calls
    assert {f"secretsmanager:{operations[c]}" for c in calls} == {"secretsmanager:GetSecretValue"}


def test_task_role_reads_exactly_the_profiles_secrets(module_plans: dict[str, Any]) -> None:
    """GetSecretValue on each ARN of profile_secret_arns (once, however often listed) and
    kms:Decrypt on their keys through Secrets Manager in the secrets' regions: nothing
    else beyond what the worker's DynamoDB calls need."""
    plan = module_plans["profiles"]
    expected = derived_grants(worker_needs(), arns(plan), [], stream_attribute_list=True)
    secrets = sorted(set(PROFILES["profile_secret_arns"]))
    assert len(secrets) == 2 < len(PROFILES["profile_secret_arns"])
    for arn in secrets:
        expected[arn] = {"secretsmanager:GetSecretValue": NONE}
    for key in PROFILES["profile_secret_kms_key_arns"]:
        expected[key] = {"kms:Decrypt": frozenset({via_secrets_manager("eu-west-1",
                                                                       "us-east-1")})}
    granted = policy(plan, "task")
    assert not differences(granted, expected), "\n".join(differences(granted, expected))


def test_execution_role_reads_exactly_the_profiles_env_secrets(
        module_plans: dict[str, Any]) -> None:
    """GetSecretValue on the secret of each profile_env_secrets value (without its JSON
    key), kms:Decrypt on the keys through Secrets Manager: beside the image pull and
    the logs, which are the default deployment's."""
    expected = policy(module_plans["defaults"], "execution")
    env_secrets = {secret_of(v) for v in PROFILES["profile_env_secrets"].values()}
    assert env_secrets == {
        "arn:aws:secretsmanager:eu-west-1:123456789012:secret:graphql-Zz9Yy8",
        "arn:aws:secretsmanager:eu-west-1:123456789012:secret:exchange/creds-Qw3Er4"}
    for arn in env_secrets:
        expected[arn] = {"secretsmanager:GetSecretValue": NONE}
    for key in PROFILES["profile_secret_kms_key_arns"]:
        expected[key] = {"kms:Decrypt": frozenset({via_secrets_manager("eu-west-1")})}
    granted = policy(module_plans["profiles"], "execution")
    assert not differences(granted, expected), "\n".join(differences(granted, expected))


# --- tracing: the ADOT collector beside the worker (tracing.tf) -------------------------------

TRACED = [n for n, v in PLAN_RUNS.items() if v.get("tracing_enabled")]
UNTRACED = [n for n in PLAN_RUNS if n not in TRACED]
COLLECTOR = "otel-collector"
RATIO_SAMPLERS = ("traceidratio", "parentbased_traceidratio")
# Where the ADOT image's /healthcheck binary asks (aws-otel-collector, cmd/healthcheck).
IMAGE_HEALTHCHECK = "127.0.0.1:13133"


def tracing_inputs(module: StaticModule, plan_name: str) -> dict[str, Any]:
    """The module's name and tracing inputs in a plan run: its values over the defaults."""
    names = [n for n in module.variables if n == "name" or n.startswith("tracing_")]
    defaults = {n: literal(module.variables[n]["default"]) for n in names}
    return {**defaults, **{k: v for k, v in PLAN_RUNS[plan_name].items() if k in names}}


def collector_config(plan: dict[str, Any]) -> dict[str, Any]:
    """The collector's configuration: AOT_CONFIG_CONTENT, its only variable, as YAML."""
    import yaml

    env = {e["name"]: e["value"] for e in containers(plan)[COLLECTOR]["environment"]}
    assert list(env) == ["AOT_CONFIG_CONTENT"], list(env)
    config = yaml.safe_load(env["AOT_CONFIG_CONTENT"])
    assert isinstance(config, dict)
    return config


def test_the_plans_cover_tracing_both_ways() -> None:
    assert "defaults" in UNTRACED and len(TRACED) >= 2


@pytest.mark.parametrize("plan_name", UNTRACED)
def test_tracing_off_adds_nothing(module_plans: dict[str, Any], plan_name: str) -> None:
    """Off (the default): the worker alone, not waiting for anything, no OTEL_* variable
    (so the worker exports nothing), no X-Ray action on either role."""
    plan = module_plans[plan_name]
    assert list(containers(plan)) == ["worker"]
    worker = container(plan)
    assert "dependsOn" not in worker and "startTimeout" not in worker
    assert not [n for n in environment(plan) if n.startswith("OTEL_")]
    for role in ("task", "execution"):
        granted = {a for actions in policy(plan, role).values() for a in actions}
        assert not [a for a in granted if a.startswith("xray:")], role


@pytest.mark.parametrize("plan_name", TRACED)
def test_tracing_runs_the_collector_beside_the_worker(
        module_plans: dict[str, Any], module: StaticModule, plan_name: str) -> None:
    plan = module_plans[plan_name]
    inputs = tracing_inputs(module, plan_name)
    found = containers(plan)
    assert list(found) == ["worker", COLLECTOR]
    worker, collector = found["worker"], found[COLLECTOR]
    assert collector["image"] == inputs["tracing_collector_image"]
    # A collector that fails costs traces, never the task: not essential, restarted in
    # place.
    assert worker["essential"] is True and collector["essential"] is False
    assert collector["restartPolicy"] == {"enabled": True, "restartAttemptPeriod": 60}
    # The worker starts once the collector is healthy; ECS stops them in the reverse
    # order, so the worker's last spans (its releases on SIGTERM) reach a running one.
    assert worker["dependsOn"] == [{"containerName": COLLECTOR, "condition": "HEALTHY"}]
    assert worker["startTimeout"] > collector["healthCheck"]["startPeriod"]
    assert collector["healthCheck"]["command"] == ["CMD", "/healthcheck"]
    # Hardened like the worker; nothing reaches it from outside the task.
    assert collector["readonlyRootFilesystem"] is True
    assert collector["linuxParameters"]["capabilities"] == {"add": [], "drop": ["ALL"]}
    assert not collector.get("portMappings") and not collector.get("secrets")
    # Its share of the task: a CPU reservation of at most half, a hard memory limit.
    task = planned(plan)[TASK_DEFINITION]
    assert (collector["cpu"], collector["memory"]) == (inputs["tracing_collector_cpu"],
                                                       inputs["tracing_collector_memory"])
    assert collector["cpu"] <= int(task["cpu"]) / 2 and "memory" not in worker
    assert int(DEFAULTS["STREAMLEASE_BUFFER_BUDGET_BYTES"]) <= \
        (int(task["memory"]) - collector["memory"]) * 1048576 / 2
    # Its logs: the worker's group and driver settings, streams of its own.
    assert collector["logConfiguration"]["logDriver"] == worker["logConfiguration"]["logDriver"]
    options = collector["logConfiguration"]["options"]
    assert options["awslogs-stream-prefix"] == COLLECTOR
    assert {**options, "awslogs-stream-prefix": "worker"} == worker["logConfiguration"]["options"]


@pytest.mark.parametrize("plan_name", TRACED)
def test_collector_receives_otlp_on_loopback_and_sends_to_xray(
        module_plans: dict[str, Any], module: StaticModule, plan_name: str) -> None:
    config = collector_config(module_plans[plan_name])
    # OTLP/HTTP on loopback only: the task's containers share its network namespace.
    assert config["receivers"] == {"otlp": {"protocols": {"http": {"endpoint": "127.0.0.1:4318"}}}}
    assert config["exporters"] == {"awsxray": {"region": "eu-west-1"}}  # the provider's
    assert config["extensions"] == {"health_check": {"endpoint": IMAGE_HEALTHCHECK}}
    service = config["service"]
    assert service["extensions"] == ["health_check"]
    assert service["pipelines"] == {"traces": {
        "receivers": ["otlp"],
        "processors": ["memory_limiter", "resourcedetection", "batch"],
        "exporters": ["awsxray"]}}
    assert set(config["processors"]) == set(service["pipelines"]["traces"]["processors"])
    # Spans are refused before the container's hard limit is reached.
    limiter = config["processors"]["memory_limiter"]
    assert 0 < limiter["spike_limit_mib"] < limiter["limit_mib"] \
        < tracing_inputs(module, plan_name)["tracing_collector_memory"]


@pytest.mark.parametrize("plan_name", TRACED)
def test_tracing_points_the_worker_at_the_collector(
        module_plans: dict[str, Any], module: StaticModule, plan_name: str) -> None:
    plan = module_plans[plan_name]
    inputs = tracing_inputs(module, plan_name)
    receiver = collector_config(plan)["receivers"]["otlp"]["protocols"]["http"]["endpoint"]
    expected = {
        "OTEL_SERVICE_NAME": inputs["name"],
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{receiver}",
        "OTEL_TRACES_SAMPLER": inputs["tracing_sampler"],
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_LOGS_EXPORTER": "none",
    }
    if inputs["tracing_sampler"] in RATIO_SAMPLERS:
        expected["OTEL_TRACES_SAMPLER_ARG"] = str(inputs["tracing_sampler_arg"])
    env = environment(plan)
    assert {k: v for k, v in env.items() if k.startswith("OTEL_")} == expected
    if plan_name == "tracing":  # every other input at its default: the worker's settings too
        assert {k: v for k, v in env.items() if not k.startswith("OTEL_")} == \
            environment(module_plans["defaults"])


@pytest.mark.parametrize("plan_name", TRACED)
def test_the_opentelemetry_sdk_reads_that_environment(
        module_plans: dict[str, Any], module: StaticModule, plan_name: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What the OpenTelemetry SDK and its OTLP/HTTP exporter (the worker's tracing extra)
    make of the environment: the configured sampler, the collector's traces URL."""
    sdk = pytest.importorskip("opentelemetry.sdk.trace",
                              reason="opentelemetry-sdk is not installed")
    exporters = pytest.importorskip("opentelemetry.exporter.otlp.proto.http.trace_exporter",
                                    reason="opentelemetry-exporter-otlp-proto-http is not "
                                           "installed")
    from opentelemetry.sdk.trace import sampling

    inputs = tracing_inputs(module, plan_name)
    for name in [n for n in os.environ if n.startswith("OTEL_")]:
        monkeypatch.delenv(name)
    for name, value in environment(module_plans[plan_name]).items():
        if name.startswith("OTEL_"):
            monkeypatch.setenv(name, value)
    # The SDK's own table of OTEL_TRACES_SAMPLER names (private: there is no public one).
    known = sampling._KNOWN_SAMPLERS[inputs["tracing_sampler"]]
    want = known(inputs["tracing_sampler_arg"]) if inputs["tracing_sampler"] in RATIO_SAMPLERS \
        else known
    assert sdk.TracerProvider().sampler.get_description() == want.get_description()
    exporter = exporters.OTLPSpanExporter()
    assert exporter._endpoint == "http://127.0.0.1:4318/v1/traces"  # where it will POST


def test_tracing_samplers_are_the_sdk_s(module: StaticModule) -> None:
    """tracing_sampler takes exactly the OpenTelemetry SDK's built-in samplers: a name
    the SDK did not know would fall back, with a warning, to sampling every trace."""
    pytest.importorskip("opentelemetry.sdk.trace", reason="opentelemetry-sdk is not installed")
    from opentelemetry.sdk.trace import sampling

    (rule,) = iter_blocks(module.variables["tracing_sampler"], "validation")
    allowed = set(re.findall(r'"([a-z_]+)"', str(rule["condition"])))
    assert allowed == set(sampling._KNOWN_SAMPLERS)
    assert set(RATIO_SAMPLERS) <= allowed


@pytest.mark.parametrize("plan_name", TRACED)
def test_tracing_lets_the_task_role_write_to_xray(module_plans: dict[str, Any],
                                                  plan_name: str) -> None:
    """The five X-Ray calls of AWS's AWSXRayDaemonWriteAccess, on "*" (none of them has a
    resource-level permission) in the task's region; everything else the task role
    holds is what it holds without tracing."""
    plan = module_plans[plan_name]
    expected = policy(module_plans["defaults"], "task")
    in_region: Condition = ("StringEquals", "aws:RequestedRegion", ("eu-west-1",))
    expected.setdefault("*", {}).update(dict.fromkeys([
        "xray:PutTraceSegments", "xray:PutTelemetryRecords", "xray:GetSamplingRules",
        "xray:GetSamplingTargets", "xray:GetSamplingStatisticSummaries"],
        frozenset({in_region})))
    granted = policy(plan, "task")
    assert not differences(granted, expected), "\n".join(differences(granted, expected))


def test_tracing_pulls_the_collector_from_ecr_only_when_it_is_there(
        module_plans: dict[str, Any]) -> None:
    """public.ecr.aws needs no grant; a collector image in ECR (a pull-through cache) gets
    the pull of its repository, beside the worker's."""
    assert policy(module_plans["tracing"], "execution") == \
        policy(module_plans["defaults"], "execution")
    expected = policy(module_plans["defaults"], "execution")
    expected["arn:aws:ecr:eu-west-1:123456789012:repository/ecr-public/aws-observability/"
             "aws-otel-collector"] = {"ecr:BatchGetImage": NONE,
                                      "ecr:GetDownloadUrlForLayer": NONE}
    assert policy(module_plans["tracing_custom"], "execution") == expected


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


def test_example_adds_the_collector_with_tracing(example_report: Report) -> None:
    def task(run: str) -> dict[str, Any]:
        result = example_report.run("tests/example.tftest.hcl", run)
        assert result.status == "pass" and result.plan is not None, result.explain()
        values: dict[str, Any] = planned(result.plan)[f"module.streamlease.{TASK_DEFINITION}"]
        return values

    def names(values: dict[str, Any]) -> list[str]:
        return [c["name"] for c in json.loads(values["container_definitions"])]

    traced, plain = task("with_tracing"), task("regular_fargate_only")
    assert names(traced) == ["worker", COLLECTOR] and traced["memory"] == "2048"
    assert names(plain) == ["worker"] and plain["memory"] == "1024"


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
    no_validation_ok = {"tags", "deletion_protection", "tracing_enabled",  # a map, bools
                        "change_feed"}
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
