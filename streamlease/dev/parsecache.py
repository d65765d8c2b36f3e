"""Expressions parsed once per text, not once per request, in the embedded DynamoDB.

moto parses an ``UpdateExpression`` twice per ``UpdateItem`` and lexes a
``ConditionExpression`` twice with regular expressions it compiles per token: about a
fifth of a conditional write's time under the request lock, for the same few texts a fleet
sends over and over. Both results depend on the text alone (placeholder values are
substituted later), and neither is changed by its readers: moto's ``Validator`` deep-copies
the update tree before it substitutes, and the condition parser consumes a fresh queue of
the shared tokens and builds new nodes. A text that does not parse raises every time
(failures are not kept); a condition that does not parse gets DynamoDB's
``ValidationException`` instead of moto's HTTP 500.
"""

from __future__ import annotations

import functools
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from moto.dynamodb.comparisons import ConditionExpressionParser
from moto.dynamodb.exceptions import MockValidationException
from moto.dynamodb.parsing.expressions import UpdateExpressionParser  # type: ignore[attr-defined]

CACHED_TEXTS = 4096  # distinct expression texts kept, per kind

_lock = threading.Lock()
_original_make: Callable[[str], Any] | None = None
_original_lex: Callable[[Any], deque[Any]] | None = None
_original_parse: Callable[[Any], Any] | None = None


@functools.lru_cache(maxsize=CACHED_TEXTS)
def _update_tree(expression: str) -> Any:
    assert _original_make is not None
    return _original_make(expression)


@functools.lru_cache(maxsize=CACHED_TEXTS)
def _condition_tokens(expression: str) -> tuple[Any, ...]:
    assert _original_lex is not None
    return tuple(_original_lex(ConditionExpressionParser(expression, {}, {})))


def _cached_make(cls: Any, expression: str) -> Any:
    return _update_tree(expression)


def _cached_lex(self: Any) -> deque[Any]:
    return deque(_condition_tokens(self.condition_expression))


def _refusing_parse(self: Any) -> Any:
    assert _original_parse is not None
    try:
        return _original_parse(self)
    except ValueError as exc:
        raise MockValidationException(
            f"Invalid expression: Syntax error; {exc}") from None


def install_parse_caches() -> None:
    """Patch moto (in this process) to parse each expression text once, and to refuse a
    condition that does not parse as DynamoDB does."""
    global _original_make, _original_lex, _original_parse
    with _lock:
        if _original_make is not None:
            return
        _original_make = UpdateExpressionParser.make
        _original_lex = ConditionExpressionParser._lex_condition_expression
        _original_parse = ConditionExpressionParser.parse
        ConditionExpressionParser.parse = _refusing_parse  # type: ignore[method-assign]
        UpdateExpressionParser.make = classmethod(_cached_make)
        ConditionExpressionParser._lex_condition_expression = _cached_lex  # type: ignore[method-assign]
