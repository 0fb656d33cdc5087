"""`python3 -m govern ...` runs the `govern` command (see `govern --help`)."""

import sys

from .cli import main

sys.exit(main())
