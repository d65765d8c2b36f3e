"""Upstream profiles: how one kind of upstream is spoken to, as plain values and pure rules.

A profile (docs/contract.md, "Upstream profiles") says which headers to send, what to send
after the connection opens and which reply to wait for, where a frame's sequence number is,
how a reconnect asks for a replay, which frames are control frames, what keeps the
connection alive, and whether binary frames carry data. This module parses and validates
profile files, renders templates and classifies frames. It is pure: no I/O, no asyncio, no
clock, no logging; the pump applies what it decides, and ``streamlease.secrets`` fetches the
values that templates reference.

Templates and JSON pointers are as docs/profiles.md states. A rendered template that uses a
secret reference is itself secret (``Template.has_secrets``), and no error raised here
quotes a rendered value, only the reference.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from streamlease.core.frames import MAX_SEQ, Frame, Malformed

BUILTIN = "streamlease"
DEFAULT_SEQ_POINTER = "/seq"
DEFAULT_RESUME_PARAM = "from_seq"
DEFAULT_EXPECT_TIMEOUT_S = 10.0
MAX_SECONDS = 3600.0

PROFILE_KEYS = frozenset({"headers", "on_open", "seq", "resume", "skip", "keepalive", "binary"})
STEP_KEYS = frozenset({"send", "expect", "timeout_s"})
KEEPALIVE_KEYS = frozenset({"send", "every_s"})
RESUME_MODES = ("query", "message", "none")

PROFILE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
"""A profile's name, matched against the whole name."""
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an HTTP token (RFC 9110)
_QUERY_PARAM = re.compile(r"[A-Za-z0-9_.~\[\]-]{1,64}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ITEM_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_SECRET_ARN = re.compile(
    r"arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:\d{12}:secret:[A-Za-z0-9/_+=.@-]+")
_SUBPROTOCOL = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")

# Headers the WebSocket handshake owns; a profile may not set them.
RESERVED_HEADERS = frozenset({
    "host", "connection", "upgrade", "sec-websocket-key", "sec-websocket-version",
    "sec-websocket-accept", "sec-websocket-extensions", "content-length", "transfer-encoding",
})
# Not sent as a header: the client negotiates subprotocols itself (``Profile.subprotocols``).
SUBPROTOCOL_HEADER = "sec-websocket-protocol"


class ProfileError(ValueError):
    """A profiles file is invalid. ``problems`` lists every problem found, each as
    ``profile NAME: key: what is wrong``; the config layer turns them into ``ConfigError``."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


class UnresolvedReference(LookupError):
    """A template reference has no value at render time (a secret that could not be
    fetched, an item attribute that is missing). The message names the reference, never
    any value."""

    def __init__(self, ref: str, why: str) -> None:
        self.ref = ref
        super().__init__(f"{ref}: {why}")


# --- JSON values and pointers -------------------------------------------------------------


MISSING: object = object()
"""What ``Pointer.get`` returns where the document has no value."""


def json_equal(a: object, b: object) -> bool:
    """JSON equality: ``true`` is not ``1``, ``1`` is ``1.0``, objects compare by key."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def _json_problem(value: object, depth: int = 0) -> str | None:
    """Why ``value`` (read from JSON or TOML) is not a plain JSON value, or None."""
    if depth > 32:
        return "nested too deep"
    if value is None or isinstance(value, str | bool | int):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else "not a finite number"
    if isinstance(value, list):
        return next((p for v in value if (p := _json_problem(v, depth + 1))), None)
    if isinstance(value, dict):
        return next((p for v in value.values() if (p := _json_problem(v, depth + 1))), None)
    return f"{type(value).__name__} is not a JSON value"


@dataclass(frozen=True)
class Pointer:
    """An RFC 6901 JSON pointer, parsed. ``text`` is the pointer as written."""

    text: str
    tokens: tuple[str, ...]

    @staticmethod
    def parse(text: str) -> Pointer:
        """Raise ValueError for text that is not a JSON pointer."""
        if text == "":
            return Pointer("", ())
        if not text.startswith("/"):
            raise ValueError("a JSON pointer starts with '/'")
        tokens = []
        for raw in text[1:].split("/"):
            if re.search(r"~(?![01])", raw):
                raise ValueError("'~' must be followed by 0 or 1 (~0 is '~', ~1 is '/')")
            tokens.append(raw.replace("~1", "/").replace("~0", "~"))
        return Pointer(text, tuple(tokens))

    def get(self, doc: object) -> object:
        """The value at this pointer in ``doc``, or ``MISSING``."""
        node = doc
        for token in self.tokens:
            if type(node) is dict or isinstance(node, dict):
                node = node.get(token, MISSING)
                if node is MISSING:
                    return MISSING
            elif isinstance(node, list):
                # Array indices: "0" or digits without a leading zero; "-" names no element.
                if not re.fullmatch(r"0|[1-9][0-9]*", token) or int(token) >= len(node):
                    return MISSING
                node = node[int(token)]
            else:
                return MISSING
        return node


def pointers_match(doc: object, wanted: Sequence[tuple[Pointer, object]]) -> bool:
    """True if every pointer in ``wanted`` is present in ``doc`` with an equal value."""
    for pointer, value in wanted:
        found = pointer.get(doc)
        if found is MISSING or not json_equal(found, value):
            return False
    return True


# --- templates ----------------------------------------------------------------------------

RefKind = Literal["stream_id", "from_seq", "item", "env", "file", "secretsmanager"]
SECRET_KINDS: frozenset[str] = frozenset({"env", "file", "secretsmanager"})


@dataclass(frozen=True)
class Ref:
    """One ``${…}`` reference. ``name`` is empty for ``stream_id`` and ``from_seq``."""

    kind: RefKind
    name: str = ""

    @property
    def is_secret(self) -> bool:
        return self.kind in SECRET_KINDS

    @property
    def text(self) -> str:
        """The reference as written, for messages (never a value)."""
        if not self.name:
            return "${" + self.kind + "}"
        sep = "." if self.kind == "item" else ":"
        return "${" + self.kind + sep + self.name + "}"


def parse_ref(body: str) -> Ref:
    """The reference inside ``${…}``; ValueError naming what is wrong."""
    if body in ("stream_id", "from_seq"):
        return Ref(body)  # type: ignore[arg-type]
    if body.startswith("item."):
        name = body[len("item."):]
        if not _ITEM_NAME.fullmatch(name):
            raise ValueError(f"${{{body}}}: an item attribute name is letters, digits, "
                             "'_', '.' or '-'")
        return Ref("item", name)
    kind, sep, name = body.partition(":")
    if not sep:
        raise ValueError(f"${{{body}}}: unknown reference (known: stream_id, from_seq, "
                         "item.NAME, env:NAME, file:/path, secretsmanager:ARN)")
    if kind == "env":
        if not _ENV_NAME.fullmatch(name):
            raise ValueError(f"${{{body}}}: not an environment variable name")
        return Ref("env", name)
    if kind == "file":
        if not name.startswith("/") or "\x00" in name:
            raise ValueError(f"${{{body}}}: a file reference needs an absolute path")
        return Ref("file", name)
    if kind == "secretsmanager":
        if not _SECRET_ARN.fullmatch(name):
            raise ValueError(f"${{{body}}}: not a Secrets Manager secret ARN "
                             "(arn:aws:secretsmanager:REGION:ACCOUNT:secret:NAME)")
        return Ref("secretsmanager", name)
    raise ValueError(f"${{{body}}}: unknown reference kind '{kind}' (known: env, file, "
                     "secretsmanager)")


@dataclass(frozen=True)
class Template:
    """A string with ``${…}`` references, parsed once at load time. ``parts`` alternates
    literal text and references; ``source`` is the template as written (it holds no
    values, so it is safe to show)."""

    source: str
    parts: tuple[str | Ref, ...]

    @staticmethod
    def parse(source: str) -> Template:
        """Raise ValueError on an unknown reference, an unterminated ``${`` or a ``$``
        that starts neither ``${`` nor ``$$``."""
        parts: list[str | Ref] = []
        text: list[str] = []
        i = 0
        while i < len(source):
            ch = source[i]
            if ch != "$":
                text.append(ch)
                i += 1
                continue
            nxt = source[i + 1:i + 2]
            if nxt == "$":
                text.append("$")
                i += 2
            elif nxt == "{":
                end = source.find("}", i + 2)
                if end < 0:
                    raise ValueError(f"unterminated '${{' at offset {i}")
                if text:
                    parts.append("".join(text))
                    text = []
                parts.append(parse_ref(source[i + 2:end]))
                i = end + 1
            else:
                raise ValueError(f"'$' at offset {i} starts neither '${{…}}' nor '$$' "
                                 "(write $$ for a literal $)")
        if text:
            parts.append("".join(text))
        return Template(source, tuple(parts))

    @property
    def refs(self) -> tuple[Ref, ...]:
        return tuple(p for p in self.parts if isinstance(p, Ref))

    @property
    def has_secrets(self) -> bool:
        """True if a rendering of this template holds a secret (never log it)."""
        return any(r.is_secret for r in self.refs)

    def literal_text(self) -> str:
        return "".join(p for p in self.parts if isinstance(p, str))


SecretLookup = Callable[[Ref], str]


def _item_text(item: Mapping[str, object], ref: Ref) -> str:
    if ref.name not in item:
        raise UnresolvedReference(ref.text, "the stream item has no such attribute")
    value = item[ref.name]
    if isinstance(value, str):
        return value
    if isinstance(value, int | Decimal) and not isinstance(value, bool):
        return str(value)
    raise UnresolvedReference(ref.text, "the attribute is not a string or a number")


def render(template: Template, stream_id: str, from_seq: int, item: Mapping[str, object],
           secret_lookup: SecretLookup) -> str:
    """The template with every reference replaced. ``secret_lookup`` returns the value of
    an ``env``/``file``/``secretsmanager`` reference, or raises ``LookupError`` (KeyError
    included); any failure raises ``UnresolvedReference`` naming the reference only."""
    out: list[str] = []
    for part in template.parts:
        if isinstance(part, str):
            out.append(part)
        elif part.kind == "stream_id":
            out.append(stream_id)
        elif part.kind == "from_seq":
            out.append(str(from_seq))
        elif part.kind == "item":
            out.append(_item_text(item, part))
        else:
            try:
                out.append(secret_lookup(part))
            except UnresolvedReference:
                raise
            except LookupError:
                # No chaining: a lookup's own error could quote more than the reference.
                raise UnresolvedReference(part.text, "no value") from None
    return "".join(out)


def render_headers(profile: Profile, stream_id: str, from_seq: int,
                   item: Mapping[str, object],
                   secret_lookup: SecretLookup) -> list[tuple[str, str]]:
    """The profile's headers rendered. A value with a line break or NUL (from a secret
    or an item attribute) would split the request: refused, naming the header."""
    out = []
    for name, template in profile.headers:
        value = render(template, stream_id, from_seq, item, secret_lookup)
        if any(ch in value for ch in "\r\n\x00"):
            raise UnresolvedReference(template.source,
                                      f"header {name}: the value holds a line break or NUL")
        out.append((name, value))
    return out


# --- the profile --------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One ``on_open`` entry: send ``send``; if ``expect`` is given, wait up to
    ``timeout_s`` for a frame where every pointer holds its value."""

    send: Template
    expect: tuple[tuple[Pointer, object], ...] = ()
    timeout_s: float | None = None


@dataclass(frozen=True)
class Resume:
    """How a reconnect asks the upstream to replay from ``from_seq``.

    ``query``: the URL gets ``param=from_seq``. ``message``: an ``on_open`` template
    carries ``${from_seq}``. ``none``: the upstream cannot replay; what it sent while no
    connection was open is lost and the caller records a gap."""

    mode: Literal["query", "message", "none"] = "query"
    param: str = DEFAULT_RESUME_PARAM

    @property
    def replays(self) -> bool:
        return self.mode != "none"


@dataclass(frozen=True)
class Keepalive:
    send: Template
    every_s: float


@dataclass(frozen=True)
class Profile:
    """One upstream profile, validated. ``seq`` is None for ``"count"`` (the worker
    numbers data frames 1, 2, … after the checkpoint)."""

    name: str
    headers: tuple[tuple[str, Template], ...] = ()
    subprotocols: tuple[str, ...] = ()
    on_open: tuple[Step, ...] = ()
    seq: Pointer | None = field(default_factory=lambda: Pointer.parse(DEFAULT_SEQ_POINTER))
    resume: Resume = field(default_factory=Resume)
    skip: tuple[tuple[Pointer, tuple[object, ...]], ...] = ()
    keepalive: Keepalive | None = None
    binary: bool = False

    @property
    def templates(self) -> tuple[Template, ...]:
        found = [t for _, t in self.headers] + [s.send for s in self.on_open]
        if self.keepalive:
            found.append(self.keepalive.send)
        return tuple(found)

    @property
    def secret_refs(self) -> frozenset[Ref]:
        """Every secret this profile's templates reference: what to resolve before a
        connection opens."""
        return frozenset(r for t in self.templates for r in t.refs if r.is_secret)

    @property
    def item_refs(self) -> frozenset[str]:
        return frozenset(r.name for t in self.templates for r in t.refs if r.kind == "item")


BUILTIN_PROFILE = Profile(name=BUILTIN)
"""Today's protocol: ``from_seq`` in the query, ``seq`` at ``/seq``, text JSON frames only."""


def connect_url(profile: Profile, url: str, from_seq: int) -> str:
    """The URL to dial: with ``resume`` ``query``, ``param=from_seq`` set (replacing any
    value it had, other parameters kept); otherwise ``url`` unchanged."""
    if profile.resume.mode != "query":
        return url
    param = profile.resume.param
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != param]
    query.append((param, str(from_seq)))
    return urlunsplit(parts._replace(query=urlencode(query)))


# --- frames -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Data:
    """A message: ``seq`` and the payload (the parsed JSON object, or the bytes of a
    binary frame when ``binary`` is true and ``seq`` is ``count``); ``raw`` is the frame
    as received."""

    seq: int
    payload: dict[str, Any] | bytes
    raw: str | bytes


@dataclass(frozen=True)
class Control:
    """A frame that matched ``skip`` (heartbeat, ack, pong): not a message."""

    pointer: str


Classified = Data | Control | Malformed


def _decode(frame: str | bytes) -> dict[str, Any] | Malformed:
    try:
        obj = json.loads(frame)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return Malformed("not JSON")
    if not isinstance(obj, dict):
        return Malformed(f"JSON {type(obj).__name__}, not an object")
    return obj


def classify(frame: str | bytes, profile: Profile, count: int) -> tuple[Classified, int]:
    """What one frame is, and the counter after it.

    ``count`` is the last sequence number the worker assigned (the checkpoint when the
    connection opened); it moves only for data frames under ``seq: "count"``. Skip rules
    run before the sequence rule (a heartbeat has no sequence number). A binary frame is
    malformed unless ``binary`` is true; then under ``count`` it is data as raw bytes,
    and under a pointer it must hold a UTF-8 JSON object like a text frame."""
    if isinstance(frame, bytes):
        if not profile.binary:
            return Malformed("binary frame"), count
        if profile.seq is None:
            if count >= MAX_SEQ:
                return Malformed("frame count past the largest seq"), count
            return Data(count + 1, frame, frame), count + 1
        try:
            # Strictly UTF-8 (json.loads would also take UTF-16/32 and a BOM, and the text
            # passed on would then not be the JSON that was read).
            obj = _decode(frame.decode("utf-8"))
        except UnicodeDecodeError:
            return Malformed("not JSON"), count
    else:
        obj = _decode(frame)
    if isinstance(obj, Malformed):
        return obj, count
    for pointer, values in profile.skip:
        found = pointer.get(obj)
        if found is not MISSING and any(json_equal(found, v) for v in values):
            return Control(pointer.text), count
    if profile.seq is None:
        if count >= MAX_SEQ:
            return Malformed("frame count past the largest seq"), count
        return Data(count + 1, obj, frame), count + 1
    seq = profile.seq.get(obj)
    if seq is MISSING:
        return Malformed(f"no seq at {profile.seq.text}"), count
    if isinstance(seq, bool) or not isinstance(seq, int):
        return Malformed(f"no integer seq at {profile.seq.text}"), count
    if not 1 <= seq <= MAX_SEQ:
        return Malformed(f"seq {seq} out of range"), count
    return Data(seq, obj, frame), count


def _scalar_key(value: object) -> tuple[str, object] | None:
    """A hashable key that two JSON scalars share exactly when ``json_equal`` says they
    are equal (``true`` is not ``1``; ``1`` is ``1.0``), or None for anything else."""
    if isinstance(value, bool):
        return ("b", value)
    if isinstance(value, int | float):
        return ("n", value)  # 1 == 1.0 and hash(1) == hash(1.0)
    if isinstance(value, str):
        return ("s", value)
    if value is None:
        return ("z", None)
    return None


@dataclass(frozen=True)
class TextClassifier:
    """``classify`` for a text frame, compiled once per profile: skip values looked up in a
    set instead of compared one by one, pointers walked without re-parsing. Same answers as
    ``classify`` (tests/core/test_profiles.py checks them side by side)."""

    skip: tuple[tuple[Pointer, frozenset[tuple[str, object]], tuple[object, ...]], ...]
    seq: Pointer | None

    @staticmethod
    def of(profile: Profile) -> TextClassifier:
        rules = []
        for pointer, values in profile.skip:
            keys = {k for v in values if (k := _scalar_key(v)) is not None}
            others = tuple(v for v in values if _scalar_key(v) is None)
            rules.append((pointer, frozenset(keys), others))
        return TextClassifier(tuple(rules), profile.seq)

    def frame(self, text: str, count: int) -> Frame | Control | Malformed:
        """``classify`` for the pump's hot path: a message comes back as the ``Frame`` the
        sink takes (``Data`` is not built), the count as ``frame.seq``."""
        try:
            obj = json.loads(text)
        except (ValueError, RecursionError):
            return Malformed("not JSON")
        if type(obj) is not dict:
            return Malformed(f"JSON {type(obj).__name__}, not an object")
        for pointer, keys, others in self.skip:
            found = pointer.get(obj)
            if found is MISSING:
                continue
            key = _scalar_key(found)
            if (key is not None and key in keys) or \
                    (others and any(json_equal(found, v) for v in others)):
                return Control(pointer.text)
        if self.seq is None:
            if count >= MAX_SEQ:
                return Malformed("frame count past the largest seq")
            return Frame(count + 1, text)
        seq = self.seq.get(obj)
        if type(seq) is not int:
            if seq is MISSING:
                return Malformed(f"no seq at {self.seq.text}")
            return Malformed(f"no integer seq at {self.seq.text}")
        if not 1 <= seq <= MAX_SEQ:
            return Malformed(f"seq {seq} out of range")
        return Frame(seq, text)


def reply_matches(frame: str | bytes, step: Step) -> bool:
    """True if ``frame`` is a JSON object holding every value ``step.expect`` asks for."""
    obj = _decode(frame)
    return not isinstance(obj, Malformed) and pointers_match(obj, step.expect)


# --- parsing and validation ---------------------------------------------------------------


class _Problems:
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, where: str, what: str) -> None:
        self.items.append(f"{where}: {what}")


def _template(raw: object, where: str, problems: _Problems) -> Template | None:
    if not isinstance(raw, str):
        problems.add(where, "must be a string (a template)")
        return None
    try:
        return Template.parse(raw)
    except ValueError as exc:
        problems.add(where, str(exc))
        return None


def _seconds(raw: object, where: str, problems: _Problems) -> float | None:
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
        problems.add(where, "must be a number of seconds")
        return None
    if not 0 < raw <= MAX_SECONDS:
        problems.add(where, f"must be above 0 and at most {MAX_SECONDS:g}")
        return None
    return float(raw)


def _pointer(raw: str, where: str, problems: _Problems) -> Pointer | None:
    try:
        return Pointer.parse(raw)
    except ValueError as exc:
        problems.add(where, f"{raw!r}: {exc}")
        return None


def _unknown_keys(raw: Mapping[str, object], known: frozenset[str], where: str,
                  problems: _Problems) -> None:
    for key in sorted(set(raw) - known):
        problems.add(where, f"unknown key {key!r} (known: {', '.join(sorted(known))})")


def _headers(raw: object, where: str,
             problems: _Problems) -> tuple[tuple[tuple[str, Template], ...], tuple[str, ...]]:
    if not isinstance(raw, dict):
        problems.add(where, "must be an object: header name -> template")
        return (), ()
    headers: list[tuple[str, Template]] = []
    subprotocols: tuple[str, ...] = ()
    seen: set[str] = set()
    for name, value in raw.items():
        at = f"{where}.{name}"
        lower = name.lower()
        if not HEADER_NAME.fullmatch(name):
            problems.add(at, "not a valid header name")
            continue
        if lower in seen:
            problems.add(at, "given twice (header names ignore case)")
            continue
        seen.add(lower)
        if lower in RESERVED_HEADERS:
            problems.add(at, "set by the WebSocket handshake itself; a profile may not set it")
            continue
        template = _template(value, at, problems)
        if template is None:
            continue
        if any(ch in template.literal_text() for ch in "\r\n\x00"):
            problems.add(at, "a header value may not hold a line break or NUL")
            continue
        if lower == SUBPROTOCOL_HEADER:
            if template.refs:
                problems.add(at, "subprotocols are negotiated names: no ${…} references")
                continue
            names = tuple(p.strip() for p in template.literal_text().split(","))
            if not all(_SUBPROTOCOL.fullmatch(n) for n in names):
                problems.add(at, "a comma-separated list of subprotocol names")
                continue
            subprotocols = names
            continue
        headers.append((name, template))
    return tuple(headers), subprotocols


def _expect(raw: object, where: str, problems: _Problems) -> tuple[tuple[Pointer, object], ...]:
    if not isinstance(raw, dict) or not raw:
        problems.add(where, "must be a non-empty object: JSON pointer -> value")
        return ()
    out = []
    for text, value in raw.items():
        pointer = _pointer(text, f"{where}.{text}", problems)
        why = _json_problem(value)
        if why:
            problems.add(f"{where}.{text}", why)
        elif pointer is not None:
            out.append((pointer, value))
    return tuple(out)


def _on_open(raw: object, where: str, problems: _Problems) -> tuple[Step, ...]:
    if not isinstance(raw, list):
        problems.add(where, "must be a list of {send, expect, timeout_s}")
        return ()
    steps = []
    for i, entry in enumerate(raw):
        at = f"{where}[{i}]"
        if not isinstance(entry, dict):
            problems.add(at, "must be an object {send, expect, timeout_s}")
            continue
        _unknown_keys(entry, STEP_KEYS, at, problems)
        if "send" not in entry:
            problems.add(f"{at}.send", "missing")
            continue
        send = _template(entry["send"], f"{at}.send", problems)
        expect = _expect(entry["expect"], f"{at}.expect", problems) if "expect" in entry else ()
        timeout: float | None = None
        if "timeout_s" in entry:
            if "expect" not in entry:
                problems.add(f"{at}.timeout_s", "only means something with expect")
            timeout = _seconds(entry["timeout_s"], f"{at}.timeout_s", problems)
        elif expect:
            timeout = DEFAULT_EXPECT_TIMEOUT_S
        if send is not None:
            steps.append(Step(send, expect, timeout if expect else None))
    return tuple(steps)


def _seq(raw: object, where: str, problems: _Problems) -> Pointer | None:
    if raw == "count":
        return None
    if not isinstance(raw, str):
        problems.add(where, 'must be a JSON pointer (like "/seq") or "count"')
        return Pointer.parse(DEFAULT_SEQ_POINTER)
    pointer = _pointer(raw, where, problems)
    if pointer is not None and not pointer.tokens:
        problems.add(where, '"" is the whole frame, not a number inside it')
    return pointer or Pointer.parse(DEFAULT_SEQ_POINTER)


def _resume(raw: object, where: str, problems: _Problems) -> Resume:
    if not isinstance(raw, dict):
        problems.add(where, 'must be an object like {"mode": "query", "param": "from_seq"}')
        return Resume()
    mode = raw.get("mode", "query")
    if mode not in RESUME_MODES:
        problems.add(f"{where}.mode", f"must be one of {', '.join(RESUME_MODES)}")
        return Resume()
    known = frozenset({"mode", "param"}) if mode == "query" else frozenset({"mode"})
    _unknown_keys(raw, known, where, problems)
    param = raw.get("param", DEFAULT_RESUME_PARAM)
    if mode == "query" and (not isinstance(param, str) or not _QUERY_PARAM.fullmatch(param)):
        problems.add(f"{where}.param", "must be a query parameter name (letters, digits, _.-~[])")
        param = DEFAULT_RESUME_PARAM
    return Resume(mode, param)


def _skip(raw: object, where: str,
          problems: _Problems) -> tuple[tuple[Pointer, tuple[object, ...]], ...]:
    if not isinstance(raw, dict):
        problems.add(where, "must be an object: JSON pointer -> list of values")
        return ()
    out = []
    for text, values in raw.items():
        at = f"{where}.{text}"
        pointer = _pointer(text, at, problems)
        if not isinstance(values, list) or not values:
            problems.add(at, "must be a non-empty list of values")
            continue
        why = _json_problem(values)
        if why:
            problems.add(at, why)
        elif pointer is not None:
            out.append((pointer, tuple(values)))
    return tuple(out)


def _keepalive(raw: object, where: str, problems: _Problems) -> Keepalive | None:
    if not isinstance(raw, dict):
        problems.add(where, "must be an object {send, every_s}")
        return None
    _unknown_keys(raw, KEEPALIVE_KEYS, where, problems)
    for key in ("send", "every_s"):
        if key not in raw:
            problems.add(f"{where}.{key}", "missing")
    send = _template(raw["send"], f"{where}.send", problems) if "send" in raw else None
    every = _seconds(raw["every_s"], f"{where}.every_s", problems) if "every_s" in raw else None
    if send is None or every is None:
        return None
    return Keepalive(send, every)


def parse_profile(name: str, raw: object) -> tuple[Profile | None, list[str]]:
    """One profile from its decoded JSON/TOML value: the profile, or every problem."""
    problems = _Problems()
    where = f"profile {name}"
    if not isinstance(raw, dict):
        problems.add(where, "must be an object")
        return None, problems.items
    _unknown_keys(raw, PROFILE_KEYS, where, problems)

    def at(key: str) -> str:
        return f"{where}: {key}"

    headers, subprotocols = _headers(raw["headers"], at("headers"), problems) \
        if "headers" in raw else ((), ())
    on_open = _on_open(raw["on_open"], at("on_open"), problems) if "on_open" in raw else ()
    seq = _seq(raw["seq"], at("seq"), problems) if "seq" in raw \
        else Pointer.parse(DEFAULT_SEQ_POINTER)
    resume = _resume(raw["resume"], at("resume"), problems) if "resume" in raw else Resume()
    skip = _skip(raw["skip"], at("skip"), problems) if "skip" in raw else ()
    keepalive = _keepalive(raw["keepalive"], at("keepalive"), problems) \
        if "keepalive" in raw else None
    binary = raw.get("binary", False)
    if not isinstance(binary, bool):
        problems.add(at("binary"), "must be true or false")
        binary = False

    # Rules across keys.
    if resume.mode == "message" and not any(
            r.kind == "from_seq" for step in on_open for r in step.send.refs):
        problems.add(at("resume"), 'mode "message" needs an on_open send that carries '
                     "${from_seq}")
    if seq is None and resume.mode != "none":
        problems.add(at("seq"), '"count" numbers frames on this side, so the upstream '
                     'cannot replay by it: set resume to {"mode": "none"}')
    if problems.items:
        return None, problems.items
    return Profile(name=name, headers=headers, subprotocols=subprotocols, on_open=on_open,
                   seq=seq, resume=resume, skip=skip, keepalive=keepalive,
                   binary=binary), []


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"key {key!r} given twice")
        seen[key] = value
    return seen


def profile_format(path: str) -> Literal["json", "toml"] | None:
    """The format a profiles file's name implies (``.json``/``.toml``), or None."""
    lower = path.lower()
    if lower.endswith(".json"):
        return "json"
    if lower.endswith(".toml"):
        return "toml"
    return None


def parse_profiles(text: str, fmt: Literal["json", "toml"] | str) -> dict[str, Profile]:
    """Every profile in a profiles file, plus the built-in ``streamlease``. Raises
    ``ProfileError`` carrying every problem found."""
    try:
        if fmt == "json":
            raw: object = json.loads(text, object_pairs_hook=_no_duplicates)
        elif fmt == "toml":
            raw = tomllib.loads(text)
        else:
            raise ProfileError([f"profiles: unknown format {fmt!r} (json or toml)"])
    except (ValueError, RecursionError) as exc:
        if isinstance(exc, ProfileError):
            raise
        raise ProfileError([f"profiles: not valid {fmt.upper()}: {exc}"]) from exc
    if not isinstance(raw, dict):
        raise ProfileError(["profiles: must be an object mapping a profile's name to the "
                            "profile"])
    profiles = {BUILTIN: BUILTIN_PROFILE}
    problems: list[str] = []
    for name, body in raw.items():
        if name == BUILTIN:
            problems.append(f"profile {name}: reserved for the built-in protocol")
            continue
        if not PROFILE_NAME.fullmatch(name):
            problems.append(f"profile {name!r}: a name is 1-64 letters, digits, '_', '.', '-'")
            continue
        profile, found = parse_profile(name, body)
        problems.extend(found)
        if profile is not None:
            profiles[name] = profile
    if problems:
        raise ProfileError(problems)
    return profiles


def default_problem(profiles: Mapping[str, Profile], name: str) -> str | None:
    """Why ``STREAMLEASE_DEFAULT_PROFILE=name`` cannot be used, or None."""
    if name in profiles:
        return None
    return f"no profile named {name!r} (known: {', '.join(sorted(profiles))})"
