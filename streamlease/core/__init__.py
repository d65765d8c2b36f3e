"""The pure core: lease rules, reconcile planning, URL and frame checks.

Nothing under ``streamlease.core`` does I/O: no asyncio, no botocore, no websockets, no
``time``, no logging. Callers pass ``now`` in. ``tests/core/test_purity.py`` enforces it.
"""
