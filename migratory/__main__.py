import sys

from migratory.cli import main

sys.exit(main())
