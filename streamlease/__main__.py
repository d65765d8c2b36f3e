"""``python -m streamlease`` is the ``streamlease`` command."""

from streamlease.cli import main

raise SystemExit(main())
