"""`python -m training.benchmark` runs `flywheel bench agent`."""

import sys

from training.benchmark.cli import main

sys.exit(main(sys.argv[1:]))
