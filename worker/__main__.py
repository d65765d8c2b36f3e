"""``python -m worker`` is the ``streamlease`` command."""

from worker.cli import main

raise SystemExit(main())
