"""``python -m flows.cli`` is ``nllab``."""

import sys

from flows.cli import main

sys.exit(main())
