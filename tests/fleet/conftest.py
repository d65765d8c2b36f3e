"""Fleet fixtures live in tests/conftest.py so process-level tests elsewhere share them."""

from __future__ import annotations

from collections.abc import Callable

from tests.fleet.harness import Fleet

FleetFactory = Callable[..., Fleet]
