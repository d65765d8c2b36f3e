"""The worker's settings against the module's rules: which inputs terraform must refuse,
decided by streamlease/config.py.

Two sources of cases, one rule. For a set of module inputs, the worker's verdict
(``read_settings`` for each setting alone, then ``WorkerConfig.from_env`` on the
environment the module would write) says what terraform must do:

- a value the worker refuses on its own: its variable's validation fails (a plan stops
  there, so one run can refuse several variables, each listed in expect_failures);
- a combination the worker refuses: a precondition of the task definition fails;
- anything the worker accepts: the plan succeeds,

except where terraform is stricter on purpose: ``deployment_problems`` (preconditions
about ECS, not the worker) and ``STRICTER`` (list forms the worker would silently
reinterpret).

1. Generated runs (``Cases.all``), so every setting, including one added later, is
   compared on both sides of its own bounds: for each setting in ``SETTINGS`` that has a
   module variable (the one whose description starts with ``STREAMLEASE_NAME:``), values
   from its parser: a ``seconds`` or ``count`` parser's bounds (read from its closure:
   each bound, just outside it, 0, -1, a fraction or an overflow), each choice of a
   ``choice`` parser in alternating case plus one that is not a choice, fixed lists for
   table names, allowed URLs and the profile settings (``LISTED_VALUES``), the default
   for any other parser. Run i takes the i-th
   refused (or accepted) value of every variable; each run is a file of its own, so one
   disagreement does not hide the others.
2. The committed runs (``committed_cases``): terraform/modules/streamlease/tests/ puts
   every rule between settings on both sides of its boundary; the worker must agree
   with what each run expects.

The profiles file (STREAMLEASE_PROFILES) is in the image, which a plan cannot read: the
module checks its path, the worker its content at start-up. The worker's verdict is
taken with ``ImageFiles``' stand-in at that path: a file of the same format that defines
the default profile, when any file can define a profile of that name.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from streamlease.config import SETTINGS, Setting, WorkerConfig, read_settings
from streamlease.core.profiles import BUILTIN, ProfileError, parse_profiles, profile_format
from streamlease.errors import ConfigError
from tests.infra.tf import TASK_DEFINITION, StaticModule, hcl_value, literal, parse_hcl

# Settings the module deliberately has no variable for, and why.
NO_VARIABLE = {
    "STREAMLEASE_WORKER_ID": "left unset, each task uses its ECS task id, so no two tasks "
                             "can share an identity",
}

# What the module passes for every run (its required inputs).
REQUIRED = {
    "image": "123456789012.dkr.ecr.eu-west-1.amazonaws.com/streamlease:0.1.0",
    "vpc_id": "vpc-0123456789abcdef0",
    "subnet_ids": ["subnet-0123456789abcdef0"],
}

# Where terraform refuses what the worker accepts, and why.
STRICTER: list[tuple[dict[str, Any], str]] = [
    ({"allowed_urls": []}, "an empty STREAMLEASE_ALLOWED_URLS falls back to the default "
                           "wss:// in the worker; terraform asks for an explicit list"),
    ({"allowed_urls": [" wss://a"]}, "the worker strips spaces; terraform refuses them"),
    ({"allowed_urls": ["wss://a,wss://b"]}, "the worker splits on commas; terraform wants "
                                            "one URL per list element"),
    ({"leader_backend": "redis://streamlease:s3cret@cache.internal:6379/0"},
     "the worker takes Redis credentials in the URL; terraform refuses them in the "
     "variable, whose value lands in the task definition's environment (readable with "
     "ecs:DescribeTaskDefinition): they belong in leader_backend_secret_arn"),
    ({"leader_backend": "mongodb+srv://streamlease:s3cret@cluster0.ab1cd.mongodb.net/streamlease"},
     "MongoDB credentials in the URL likewise: leader_backend_secret_arn"),
    ({"leader_backend": "mongodb://db.internal:27017/streamlease?tls=true"
                        "&tlsCertificateKeyFilePassword=s3cret"},
     "the password of the client certificate's key is a credential too: "
     "leader_backend_secret_arn"),
    ({"leader_backend": "mongodb://[2001:db8::7]:27017/streamlease"},
     "the worker takes an [IPv6] MongoDB host; terraform takes DNS names and IPv4 addresses, "
     "which leader_backend_egress (IPv4 CIDRs) can open the way to"),
    ({"sink": "postgres://streamlease:s3cret@db.internal:5432/streams"},
     "the worker takes credentials in a sink URL; terraform refuses them in the variable "
     "(the task definition's environment): they belong in sink_secret_arn"),
    ({"sink": "postgres://db.internal/streams?sslmode=require&password=s3cret"},
     "a password parameter is a credential too: sink_secret_arn"),
    ({"sink": "mongodb+srv://streamlease:s3cret@cluster0.ab1cd.mongodb.net/app.events"},
     "credentials in a MongoDB sink's URL: sink_secret_arn"),
    ({"dead_letter": "https://streamlease:token@hooks.example.com/dead"},
     "credentials in the dead-letter URL: dead_letter_secret_arn"),
    ({"sink": "kinesis://streams/orders"},
     "the worker's URL parser takes a path in a stream name; the Kinesis output refuses "
     "it when the worker starts (a stream name has no '/'), terraform at plan time"),
    ({"dead_letter": "s3://acme-dlq/failed*"},
     "a '*' in the S3 key prefix would be a wildcard in the task role's S3 resource"),
    ({"profiles_path": "profiles.toml"},
     "the worker reads a relative path from its working directory; terraform asks for the "
     "file's absolute path in the image"),
    ({"profiles_path": "/tmp/streamlease/profiles.toml"},
     "the task mounts an empty volume on /tmp, which hides whatever the image holds there"),
    ({"profiles_path": "/etc/streamlease/../../tmp/profiles.json"},
     "the worker resolves . and .. parts; terraform wants the path normalised, so that the "
     "/tmp rule reads the path the worker opens"),
]

# How sinks.tf tells a secret-held output's stated resources from another service's.
AWS_ARN_SERVICES = {"kinesis": ":kinesis:", "sqs": ":sqs:", "s3": ":s3:::"}

TABLE_NAMES = ["abc", "a" * 255, "ev.t-1_x", "ab", "a" * 256, "bad name", "ev/t"]
URL_LISTS: list[list[str]] = [
    ["wss://"], ["ws://", "wss://"], ["ws://127.0.0.1:9", "wss://feeds.example.com/v1"],
    ["http://x"], ["wss://a", "https://b"],
]
# Settings whose parser says nothing about its values' bounds, given their values.
LISTED_VALUES: dict[str, list[str]] = {
    # URLs without credentials (with them terraform is STRICTER): MongoDB's forms at their
    # edges, each way, and a Redis one.
    "STREAMLEASE_LEADER_BACKEND": [
        "mongodb://db1.internal:27017,db2.internal:27017,10.0.3.7:027017/streamlease"
        "?replicaSet=rs0&authSource=admin&tls=true",
        "MongoDB+SRV://cluster0.ab1cd.mongodb.net/streamlease_leader-1"
        "?retryWrites=true&w=majority&readPreferenceTags=dc:eu,rack:1",
        "mongodb://10.0.0.5:65535/" + "d" * 63,
        "rediss://cache.internal:6380/2",
        "mongodb://db.internal:27017",  # no database
        "mongodb+srv://cluster0.ab1cd.mongodb.net:27017/streamlease",  # SRV: no port
        "mongodb+srv://a.example.net,b.example.net/streamlease",  # SRV: one host
        "mongodb://db1.internal:27017,db2.internal:65536/streamlease",
        "mongodb://db.internal/stream.lease",  # a database name has no dot
        "mongodb://db.internal/" + "d" * 64,
        "mongodb://db.internal/streamlease?replicaSet",  # an option without =
        "mongodb://db1.internal,,db2.internal/streamlease",
    ],
    "STREAMLEASE_SINK": [
        "mongodb://db1.internal:27017,db2.internal/app.events"
        "?replicaSet=rs0&checkpoints=streamlease_checkpoints&transactions=on",
        "mongodb+srv://cluster0.ab1cd.mongodb.net/app.events.v2",
        "mongodb://10.0.0.5/" + "d" * 63 + "." + "c" * 191,  # DB.COLLECTION: 255 bytes
        "mongodb://db.internal/app",  # no collection
        "mongodb://db.internal/app.system.users",
        "mongodb://db.internal/app.ev$nts",
        "mongodb://10.0.0.5/" + "d" * 63 + "." + "c" * 192,
        "mongodb+srv://a.example.net,b.example.net/app.events",
        "mongodb://db.internal:0/app.events",
        "mongodb://db.internal/.events",
    ],
    # The exactly-once sinks take only delivered messages: never a dead letter.
    "STREAMLEASE_DEAD_LETTER": ["stdout", "https://hooks.example.com/dead",
                                "mongodb://db.internal/app.dead", "postgres://db.internal/dead",
                                "dynamodb"],
    # as many accepted paths as accepted profile names, so each name comes with a file
    "STREAMLEASE_PROFILES": ["/etc/streamlease/profiles.toml", "/opt/acme/Profiles.JSON",
                             "/profiles.json", "/etc/streamlease/feeds.v2.toml",
                             "/etc/streamlease/profiles.yaml", "/etc/streamlease/profiles"],
    "STREAMLEASE_DEFAULT_PROFILE": ["streamlease", "gateway", "a" * 64, "v1.2_x-Y",
                                    "bad name", "a" * 65, "x/y"],
    "STREAMLEASE_UPSTREAM": ["python:acme.feeds:make_upstream", "python:m:A",
                             "python:_p.q_1.r:x9", "acme.feeds:make", "python:acme.feeds",
                             "python:acme.feeds:", "python:1acme:x", "python:acme..feeds:x",
                             "python:a:b:c", "python:a-b:c"],
}


class ImageFiles:
    """Stand-ins for the files a deployment's image holds (the profiles file), in a
    temporary directory that lives as long as this object."""

    def __init__(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="streamlease-image-")

    def env(self, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` with STREAMLEASE_PROFILES pointing at a stand-in of the same format
        that defines STREAMLEASE_DEFAULT_PROFILE (when a file can); a path whose name
        the worker refuses is left for it to refuse."""
        out = dict(env)
        path = out.get("STREAMLEASE_PROFILES", "").strip()
        fmt = profile_format(path) if path else None
        if fmt is None:
            return out
        default = out.get("STREAMLEASE_DEFAULT_PROFILE", "").strip() or BUILTIN
        names = [default] if default != BUILTIN and definable(default) else []
        if fmt == "json":
            text = json.dumps({name: {} for name in names})
        else:
            text = "".join(f"[{json.dumps(name)}]\n" for name in names)
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        stand_in = f"{self._dir.name}/{digest}.{fmt}"
        with open(stand_in, "w", encoding="utf-8") as handle:
            handle.write(text)
        out["STREAMLEASE_PROFILES"] = stand_in
        return out


def definable(name: str) -> bool:
    """Whether a profiles file can define a profile of this name (the worker's rule)."""
    try:
        parse_profiles(json.dumps({name: {}}), "json")
    except ProfileError:
        return False
    return True


def undefinable_default(env: Mapping[str, str]) -> list[str]:
    """The worker refuses a default profile no file can define whatever the image holds:
    that is the value's own fault, as a parser's refusal is."""
    name = env.get("STREAMLEASE_DEFAULT_PROFILE", "").strip()
    if not name or name == BUILTIN or definable(name):
        return []
    return [f"STREAMLEASE_DEFAULT_PROFILE: no profiles file can define a profile named "
            f"{name!r}"]


IMAGE = ImageFiles()


def deployment_problems(values: dict[str, Any]) -> list[str]:
    """The task definition's preconditions that are about ECS, not the worker (ecs.tf)."""
    problems = []
    if values["stop_timeout_seconds"] < values["shutdown_seconds"] + 10:
        problems.append("stop_timeout_seconds must exceed shutdown_seconds by 10 s: ECS "
                        "kills the task stop_timeout_seconds after SIGTERM")
    if values["metrics_port"] < 1024:
        problems.append("metrics_port: the ECS health check needs /healthz on a port a "
                        "non-root container can bind")
    collector_cpu, collector_memory = tracing_share(values)
    if values["buffer_budget_bytes"] > (values["memory"] - collector_memory) * 1048576 / 2:
        problems.append("buffer_budget_bytes: at most half the worker's memory (the task's "
                        "less the tracing collector's); the other half holds the "
                        "interpreter, connections, clients and requests in flight")
    if collector_cpu > values["cpu"] / 2:
        problems.append("tracing_collector_cpu: at most half the task's cpu, the rest is "
                        "the worker's")
    if str(values["leader_backend"]).lower() != "dynamodb" \
            and values.get("leader_backend_secret_arn") is not None:
        problems.append("leader_backend and leader_backend_secret_arn: one place for the "
                        "leader backend")
    if values["sink"] != "dynamodb" and values.get("sink_secret_arn") is not None:
        problems.append("sink and sink_secret_arn: one place for the sink's URL")
    if values.get("dead_letter") is not None \
            and values.get("dead_letter_secret_arn") is not None:
        problems.append("dead_letter and dead_letter_secret_arn: one place for its URL")
    for output in ("sink", "dead_letter"):
        if secret_output_problem(values, output):
            problems.append(f"{output}_kind and {output}_resource_arns must describe the "
                            f"URL in {output}_secret_arn (and only with one)")
    return problems


def tracing_share(values: dict[str, Any]) -> tuple[float, float]:
    """CPU units and MiB of memory the ADOT collector takes out of the task (tracing.tf):
    none with tracing off."""
    if not values.get("tracing_enabled"):
        return 0, 0
    return values["tracing_collector_cpu"], values["tracing_collector_memory"]


def secret_output_problem(values: dict[str, Any], output: str) -> bool:
    """A secret-held sink's description (sinks.tf local.secret_output_problems): kind and
    resources only with a secret; with one, a kind, and for an AWS kind resources of its
    service (none for the other kinds)."""
    secret = values.get(f"{output}_secret_arn")
    kind = values.get(f"{output}_kind")
    arns = values.get(f"{output}_resource_arns") or []
    if secret is None:
        return kind is not None or bool(arns)
    if kind is None:
        return True
    if kind in AWS_ARN_SERVICES:
        return not arns or not all(AWS_ARN_SERVICES[kind] in a for a in arns)
    return bool(arns)


# --- settings and variables ----------------------------------------------------------------


def setting_variables(module: StaticModule) -> tuple[dict[str, str], list[str]]:
    """{setting: variable} by description prefix, and the settings that have none."""
    found: dict[str, str] = {}
    missing = []
    for setting in SETTINGS:
        if setting.name in NO_VARIABLE:
            continue
        names = [v for v in module.variables
                 if module.description(v).startswith(f"{setting.name}:")]
        if len(names) == 1:
            found[setting.name] = names[0]
        else:
            missing.append(setting.name)
    return found, missing


def variable_type(module: StaticModule, variable: str) -> str:
    text = str(module.variables[variable].get("type", ""))
    return text[2:-1] if text.startswith("${") else text


def env_text(kind: str, value: Any) -> str | None:
    """What the module writes into the environment for a variable's value (ecs.tf). A
    bool is an on/off switch whose true is the worker's default (change_feed): true
    leaves the setting out, false writes ``off``."""
    if value is None:
        return None
    if kind == "bool":
        return None if value else "off"
    if kind == "list(string)":
        return ",".join(value)
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value)


def tf_value(kind: str, text: str) -> Any:
    if kind == "number":
        number = Decimal(text)
        return int(number) if number == number.to_integral_value() and "e" not in text \
            and "." not in text else float(text)
    return text


# --- candidate values ---------------------------------------------------------------------


def _bounds(parse: Callable[[str], Any]) -> tuple[Any, Any] | None:
    closure = inspect.getclosurevars(parse).nonlocals
    if "low" in closure and "high" in closure:
        return closure["low"], closure["high"]
    return None


def candidates(setting: Setting, kind: str) -> list[Any]:
    """Terraform values for one setting, from its parser or its listed values."""
    qualname = getattr(setting.parse, "__qualname__", "")
    texts: list[str] = []
    if kind == "bool":  # a switch: on (the setting left out) and off
        return [True, False]
    if setting.name == "STREAMLEASE_ALLOWED_URLS":
        return [list(u) for u in URL_LISTS]
    if setting.name in LISTED_VALUES:
        texts = list(LISTED_VALUES[setting.name])
    elif qualname.startswith("seconds.") and (bounds := _bounds(setting.parse)):
        low, high = (Decimal(str(b)) for b in bounds)
        texts = [str(low), str(high), str(low * Decimal("0.9")), str(high + Decimal("0.1")),
                 "0", "-1", "1e40"]
    elif qualname.startswith("count.") and (bounds := _bounds(setting.parse)):
        low, high = bounds
        texts = [str(low), str(high), str(low - 1), str(high + 1), f"{low}.5"]
    elif qualname.startswith("choice."):
        choices = inspect.getclosurevars(setting.parse).nonlocals.get("values", ())
        texts = [c.lower() if i % 2 else c.upper() for i, c in enumerate(choices)]
        texts.append("not-a-choice")
    elif setting.parse.__name__ == "table_name":
        texts = list(TABLE_NAMES)
    if setting.default and setting.default.lower() not in {x.lower() for x in texts}:
        texts.append(setting.default)
    return [tf_value(kind, t) for t in dict.fromkeys(texts)]


# --- the worker's verdict -------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    own: tuple[str, ...]  # settings refused on their own
    problems: tuple[str, ...]  # the worker's messages, or terraform-only rules

    @property
    def accepts(self) -> bool:
        return not self.problems


@dataclass
class Case:
    name: str
    values: dict[str, Any]  # terraform variables (beyond the defaults)
    expect: list[str]  # checkable objects terraform must fail
    why: str  # the worker's side, for failure messages


class Cases:
    """Every generated run, from the module's variables and the worker's settings."""

    def __init__(self, module: StaticModule) -> None:
        self.module = module
        self.variable_of, self.missing = setting_variables(module)
        self.setting_of = {v: s for s, v in self.variable_of.items()}
        self.kind = {v: variable_type(module, v) for v in self.setting_of}
        self.defaults = {n: literal(b["default"]) for n, b in module.variables.items()
                         if "default" in b}

    def env(self, values: dict[str, Any]) -> dict[str, str]:
        merged = {**self.defaults, **values}
        env = {}
        for variable, setting in self.setting_of.items():
            text = env_text(self.kind[variable], merged.get(variable))
            if text is not None:
                env[setting] = text
        return env

    def verdict(self, values: dict[str, Any]) -> Verdict:
        env = IMAGE.env(self.env(values))
        _, problems = read_settings(SETTINGS, env)
        problems += undefinable_default(env)
        if problems:
            own = tuple(sorted({p.split(":", 1)[0] for p in problems}))
            return Verdict(own, tuple(problems))
        try:
            WorkerConfig.from_env(env)
        except ConfigError as exc:
            return Verdict((), tuple(exc.problems))
        return Verdict((), tuple(deployment_problems({**self.defaults, **values})))

    def verdict_text(self, variable: str, value: Any) -> str:
        """The worker's verdict on one variable's value alone, for messages."""
        if variable not in self.setting_of:
            return "has no such setting"
        verdict = self.verdict({variable: value})
        return f"refuses it ({'; '.join(verdict.problems)[:200]})" if verdict.own \
            else "accepts it"

    def expected(self, values: dict[str, Any]) -> tuple[list[str], str]:
        verdict = self.verdict(values)
        if verdict.own:
            return [f"var.{self.variable_of[s]}" for s in verdict.own], "; ".join(
                verdict.problems)
        if verdict.problems:
            return [TASK_DEFINITION], "; ".join(verdict.problems)
        return [], "accepted"

    def single_setting_values(self) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        """Per variable: values the worker refuses alone, and values it accepts alone."""
        refused: dict[str, list[Any]] = {}
        accepted: dict[str, list[Any]] = {}
        for setting in SETTINGS:
            variable = self.variable_of.get(setting.name)
            if variable is None:
                continue
            for value in candidates(setting, self.kind[variable]):
                own = self.verdict({variable: value}).own
                (refused if own else accepted).setdefault(variable, []).append(value)
        return refused, accepted

    def all(self) -> list[Case]:
        refused, accepted = self.single_setting_values()
        cases: list[Case] = []
        for i, values in enumerate(_columns(refused), 1):
            expect = sorted(f"var.{v}" for v in values)
            why = " | ".join(self.expected({v: val})[1] for v, val in values.items())
            cases.append(Case(f"refused_{i}", values, expect, why))
        for i, values in enumerate(_columns(accepted), 1):
            expect, why = self.expected(values)
            cases.append(Case(f"accepted_{i}", values, expect, why))
        return cases

    def disagreements(self, case: Case) -> list[str]:
        """Where a run's expectation differs from what the worker decides (module inputs
        that are expressions, not literals, are left to terraform)."""
        values = {k: v for k, v in case.values.items()
                  if not (isinstance(v, str) and "${" in v)}
        worker_values = {k: v for k, v in values.items() if k in self.setting_of}
        out = []
        refused_vars = [e.removeprefix("var.") for e in case.expect if e.startswith("var.")]
        if refused_vars:
            for variable, value in worker_values.items():
                stricter = any(s.get(variable) == value for s, _ in STRICTER)
                own = bool(self.verdict({variable: value}).own)
                if (variable in refused_vars) != (own or stricter):
                    out.append(f"{variable} = {value!r}: the run expects terraform to "
                               f"{'refuse' if variable in refused_vars else 'accept'} it, "
                               f"the worker {'refuses' if own else 'accepts'} it")
            return out
        expect, why = self.expected(values)
        if expect != case.expect:
            out.append(f"{worker_values}: the run expects {case.expect or 'no failure'}, the "
                       f"worker's verdict means {expect or 'no failure'} ({why})")
        return out


def committed_cases(paths: Iterable[Path]) -> list[Case]:
    """The runs of committed test files as cases: file and run variables, literal values."""
    cases = []
    for path in paths:
        parsed = parse_hcl(path)
        common: dict[str, Any] = {}
        for block in parsed.get("variables", []):
            common.update(literal(block))
        for block in parsed.get("run", []):
            for name, body in block.items():
                values = dict(common)
                for variables in body.get("variables", []):
                    values.update(literal(variables))
                expect = [str(e).removeprefix("${").removesuffix("}")
                          for e in body.get("expect_failures", [])]
                cases.append(Case(f"{path.name}::{name}", values, expect, "committed"))
    return cases


def _columns(per_variable: dict[str, list[Any]]) -> Iterable[dict[str, Any]]:
    """Run i takes the i-th value of every variable that has one."""
    depth = max((len(v) for v in per_variable.values()), default=0)
    for i in range(depth):
        yield {var: values[i] for var, values in per_variable.items() if i < len(values)}


# --- test files ---------------------------------------------------------------------------

HEADER = """# Generated by tests/infra/worker_cases.py in a temporary copy; not in the repository.
mock_provider "aws" {
  source = "./tests/mocks"
}

"""


def test_file(case: Case) -> str:
    variables = {**REQUIRED, **case.values}
    lines = [HEADER, 'run "case" {', "  command = plan", "", "  variables {"]
    lines += [f"    {k} = {hcl_value(v)}" for k, v in variables.items()]
    lines.append("  }")
    if case.expect:
        lines.append(f"  expect_failures = [{', '.join(case.expect)}]")
    lines.append("}")
    return "\n".join(lines) + "\n"


def file_name(case: Case) -> str:
    return f"tests/worker_{case.name}.tftest.hcl"
