"""`python -m draftsmith` runs the command line."""

import sys

from draftsmith.cli import main

sys.exit(main())
