"""`python -m training.dashboard` is `flywheel dashboard`."""

import sys

from training.dashboard import main

sys.exit(main(sys.argv[1:]))
