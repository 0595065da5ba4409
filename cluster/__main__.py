"""``python -m cluster``: the ``migratory`` command (serve, pub, sub, cluster up/status)."""

import sys

from cluster.cli import main

sys.exit(main())
