"""`python -m training.cycle` = `flywheel cycle`."""

import sys

from training.cycle.cli import main

sys.exit(main(sys.argv[1:]))
