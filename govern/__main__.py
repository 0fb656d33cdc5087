"""`python3 -m govern ...` runs the `govern` command (see `govern --help`)."""

import sys

from ._cli import main

sys.exit(main())
