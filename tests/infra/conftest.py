"""Terraform, once per session: one offline working copy, three ``terraform test`` runs.

- ``module_report``: the module's committed tests (terraform/modules/streamlease/tests/)
  and the runs worker_cases.py generates from streamlease/config.py;
- ``module_plans``: plans of the module (defaults, every input changed, the fleet's
  options, Redis and MongoDB leader backends, sinks, profiles, tracing), printed with ``-verbose``
  so the tests can read what terraform would create;
- ``example_report``: the example root's tests with terraform.tfvars.example, verbose.

They start together in the background once the copy is initialised (with `terraform
validate` of both roots), so on two cores the session waits for the longest of them,
not their sum. Without terraform or the provider
mirror every test that needs them skips, saying which is missing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.infra import worker_cases
from tests.infra.tf import (
    MODULE_DIR,
    TERRAFORM,
    PendingReport,
    Report,
    RunResult,
    Toolchain,
    Workspace,
    find_toolchain,
    hcl_value,
    load_static,
    must_succeed,
)

# The plans the tests read: the module's defaults, and every input that changes what
# the tests look at.
PLAN_RUNS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "custom": {
        "image": "ghcr.io/acme/streamlease:1.0",
        "lease_seconds": 9,
        "heartbeat_seconds": 2.5,
        "member_lease_seconds": 12,
        "member_heartbeat_seconds": 3,
        "safety_margin_seconds": 1.5,
        "stop_timeout_seconds": 77,
        "metrics_port": 9200,
        "allowed_urls": ["wss://a.example/", "ws://b.example/"],
        "log_level": "debug",
    },
    # The fleet's options: the leader backend from a secret under a customer key, Redis
    # egress, tables for `job write`, a renamed fleet table.
    "fleet": {
        "fleet_table_name": "acme-fleet",
        "leader_backend_secret_arn": "arn:aws:secretsmanager:eu-west-1:123456789012:secret:"
                                     "streamlease/leader-AbCdEf",
        "leader_backend_secret_kms_key_arn": "arn:aws:kms:eu-west-1:123456789012:key/"
                                             "00000000-0000-0000-0000-00000000000c",
        "leader_backend_egress": {"cidr_blocks": ["10.20.0.0/24"], "port": 6380},
        "job_write_table_arns": ["arn:aws:dynamodb:eu-west-1:123456789012:table/ledger",
                                 "arn:aws:dynamodb:eu-west-1:123456789012:table/reports"],
        "metrics_address": "::",
    },
    # A Redis URL in the variable (no credentials): sensitive in the plan.
    "redis": {"leader_backend": "rediss://cache.internal:6380/2"},
    # MongoDB URLs in the variable (no credentials), sensitive in the plan too: a replica
    # set's members with its options, and the egress to them on 27017; ...
    "mongodb": {
        "leader_backend": "mongodb://db1.internal:27017,db2.internal:27017,10.0.3.7:27017/"
                          "streamlease?replicaSet=rs0&authSource=admin&tls=true",
        "leader_backend_egress": {"cidr_blocks": ["10.0.3.0/24", "10.0.4.0/24"],
                                  "port": 27017},
    },
    # ... and a cluster named by its DNS SRV record.
    "mongodb_srv": {"leader_backend": "mongodb+srv://cluster0.ab1cd.mongodb.net/streamlease"
                                      "?retryWrites=true&w=majority"},
    # Sinks (tests/infra/sink_calls.py): AWS outputs named by URL, ...
    "kinesis": {"sink": "kinesis://orders", "dead_letter": "s3://acme-dlq/streamlease/failed/"},
    "sqs": {"sink": "SQS://orders.fifo", "dead_letter": "https://hooks.example.com/dead",
            "process_max_attempts": 3},
    # ... a MongoDB sink, which calls no AWS API, with its egress, ...
    "mongodb_sink": {
        "sink": "mongodb://db1.internal:27017,db2.internal:27017/app.events?replicaSet=rs0",
        "sink_egress": [{"description": "MongoDB sink", "cidr_blocks": ["10.0.5.0/24"],
                         "from_port": 27017, "to_port": 27017}],
    },
    # ... and held in secrets, their kind and resources stated.
    "sink_secrets": {
        "sink_secret_arn": "arn:aws:secretsmanager:eu-west-1:123456789012:secret:"
                           "streamlease/sink-AbCdEf",
        "sink_kind": "postgres",
        "sink_egress": [{"description": "PostgreSQL sink", "cidr_blocks": ["10.30.0.0/24"],
                         "from_port": 5432, "to_port": 5432}],
        "dead_letter_secret_arn": "arn:aws:ssm:eu-west-1:123456789012:parameter/streamlease/"
                                  "dead-letter",
        "dead_letter_kind": "s3",
        "dead_letter_resource_arns": ["arn:aws:s3:::acme-dlq/failed/*"],
        "sink_secrets_kms_key_arn": "arn:aws:kms:eu-west-1:123456789012:key/"
                                    "00000000-0000-0000-0000-00000000000d",
    },
    # Upstream profiles: the file in the image, a python upstream, the templates' secrets
    # (one listed twice, one in another region and account) and two env secrets (one
    # with a JSON key), all under one customer key.
    "profiles": {
        "profiles_path": "/etc/streamlease/profiles.toml",
        "default_profile": "gateway",
        "upstream": "python:acme.feeds:make_upstream",
        "profile_secret_arns": [
            "arn:aws:secretsmanager:eu-west-1:123456789012:secret:gateway/bot-token-AbCdEf",
            "arn:aws:secretsmanager:us-east-1:210987654321:secret:exchange/api-key-Gh1jK2",
            "arn:aws:secretsmanager:eu-west-1:123456789012:secret:gateway/bot-token-AbCdEf",
        ],
        "profile_secret_kms_key_arns": ["arn:aws:kms:eu-west-1:123456789012:key/"
                                        "00000000-0000-0000-0000-00000000000e"],
        "profile_env_secrets": {
            "GRAPHQL_TOKEN": "arn:aws:secretsmanager:eu-west-1:123456789012:secret:graphql-Zz9Yy8",
            "EXCHANGE_KEY": "arn:aws:secretsmanager:eu-west-1:123456789012:secret:"
                            "exchange/creds-Qw3Er4:api_key::",
        },
    },
    # Tracing (tracing.tf): the ADOT collector with its defaults, in a task big enough
    # for it beside the worker's default buffer budget, ...
    # The change feed turned off: no stream on the streams table, no grant to read one,
    # STREAMLEASE_CHANGE_FEED=off.
    "no_change_feed": {"change_feed": False},
    "tracing": {"tracing_enabled": True, "memory": 2048},
    # ... and with every tracing input changed: a sampler without an argument, the
    # collector's image from an ECR pull-through cache of public.ecr.aws, its own sizes.
    "tracing_custom": {
        "name": "acme-feeds",
        "tracing_enabled": True,
        "tracing_sampler": "always_on",
        "tracing_collector_image": "123456789012.dkr.ecr.eu-west-1.amazonaws.com/ecr-public/"
                                   "aws-observability/aws-otel-collector:v0.49.0",
        "tracing_collector_cpu": 256,
        "tracing_collector_memory": 512,
        "cpu": 1024,
        "memory": 4096,
    },
}


class Terraform:
    """The session's working copy and its three test runs."""

    def __init__(self, toolchain: Toolchain, cases: list[worker_cases.Case]) -> None:
        self.source_files = sorted(TERRAFORM.rglob("*"))
        self.workspace = Workspace(toolchain)
        ws = self.workspace
        self.cases = cases
        for case in cases:
            ws.write(ws.module, worker_cases.file_name(case), worker_cases.test_file(case))
        ws.write(ws.module, "plans/plans.tftest.hcl", plans_file())
        inits = [(ws.init(ws.module), "terraform init (module)"),
                 (ws.init(ws.example), "terraform init (example)")]
        for proc, what in inits:
            must_succeed(proc, what)
        self.validations = {d.name: ws.start(d, "validate", "-json", "-no-color")
                            for d in (ws.module, ws.example)}
        self.module_tests = PendingReport(ws, ws.module)
        self.module_plans = PendingReport(ws, ws.module, "-verbose", "-test-directory=plans")
        self.example_tests = PendingReport(ws, ws.example, "-verbose",
                                           "-var-file=terraform.tfvars.example")

    def validation(self, name: str) -> dict[str, Any]:
        """`terraform validate -json` of the module or the example, by directory name."""
        returncode, stdout, stderr = self.validations[name].wait()
        try:
            result: dict[str, Any] = json.loads(stdout)
        except json.JSONDecodeError:
            raise AssertionError(f"validate {name}: exit {returncode}\n{stderr}") from None
        return result

    def close(self) -> None:
        for proc in self.validations.values():
            proc.kill()
        for pending in (self.module_tests, self.module_plans, self.example_tests):
            pending.kill()
        self.workspace.close()


def plans_file() -> str:
    lines = [worker_cases.HEADER.replace("worker_cases.py", "conftest.py")]
    for name, values in PLAN_RUNS.items():
        lines += [f'run "{name}" {{', "  command = plan", "", "  variables {"]
        lines += [f"    {k} = {hcl_value(v)}" for k, v in {**worker_cases.REQUIRED,
                                                            **values}.items()]
        lines += ["  }", "}", ""]
    return "\n".join(lines)


TERRAFORM_FIXTURES = {"terraform", "module_report", "module_plans", "example_report"}


@pytest.fixture(scope="session", autouse=True)
def _start_terraform_early(request: pytest.FixtureRequest) -> None:
    """Start the terraform runs before the first test here when any selected test needs
    them, so they overlap with the tests that do not (checkov, the static checks)."""
    if isinstance(find_toolchain(), str):
        return  # the tests that need terraform skip on their own, saying why
    if any(TERRAFORM_FIXTURES & set(getattr(item, "fixturenames", ()))
           for item in request.session.items):
        request.getfixturevalue("terraform")


@pytest.fixture(scope="session")
def toolchain() -> Toolchain:
    found = find_toolchain()
    if isinstance(found, str):
        pytest.skip(f"terraform checks skipped: {found}")
    return found


@pytest.fixture(scope="session")
def generated_cases() -> list[worker_cases.Case]:
    return worker_cases.Cases(load_static(MODULE_DIR)).all()


@pytest.fixture(scope="session")
def terraform(toolchain: Toolchain, generated_cases: list[worker_cases.Case]
              ) -> Iterator[Terraform]:
    session = Terraform(toolchain, generated_cases)
    try:
        yield session
    finally:
        session.close()


@pytest.fixture(scope="session")
def module_report(terraform: Terraform) -> Report:
    return terraform.module_tests.report()


@pytest.fixture(scope="session")
def example_report(terraform: Terraform) -> Report:
    return terraform.example_tests.report()


@pytest.fixture(scope="session")
def module_plans(terraform: Terraform) -> dict[str, dict[str, Any]]:
    """Run name -> the plan JSON of that run (see PLAN_RUNS)."""
    report = terraform.module_plans.report()
    plans = {}
    for name in PLAN_RUNS:
        result: RunResult = report.run("plans/plans.tftest.hcl", name)
        assert result.status == "pass" and result.plan is not None, result.explain()
        plans[name] = result.plan
    return plans
