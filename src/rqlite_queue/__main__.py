"""`python -m rqlite_queue`: the `rqlite-queue` command."""

import sys

from .cli import main

sys.exit(main())
