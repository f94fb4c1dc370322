"""`python -m rqlite_queue`: the `rqlite-queue` command (needs the `cli` extra)."""

import sys

from .cli import main

sys.exit(main())
