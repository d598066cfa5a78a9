"""`python -m agent.serve`: the same as `flywheel serve`."""

import sys

from agent.serve.cli import main

sys.exit(main(sys.argv[1:]))
