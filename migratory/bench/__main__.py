import sys

from migratory.bench.cli import main

sys.exit(main())
