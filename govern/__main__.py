"""`python3 -m govern ...` runs the `govern` command (see `govern --help`).

`python -m` puts the current directory first on `sys.path`. It is taken off before anything else is
imported: `govern check` run where a received certificate lies must not import a `rich.py` or `json.py`
shipped beside it (docs/certificate.md). Python has imported `govern` and `bide` by then, and the standard
modules their package imports start with (`typing`, `re`, `enum`, ...), which a file of that name beside
the certificate would replace: only `python3 -P -m govern` or the `govern` command avoid that.
"""

import os
import sys


def _forget_working_directory() -> None:
    """Remove the entry `python -m` put first on `sys.path` for the current directory, if it is there."""
    if sys.flags.safe_path or not sys.path:  # -P, -I or PYTHONSAFEPATH: Python did not add it
        return
    try:
        first_is_here = os.path.samefile(sys.path[0] or os.curdir, os.curdir)
    except OSError:  # a directory that is gone (or unreadable) imports nothing
        return
    if first_is_here:
        del sys.path[0]


_forget_working_directory()

from .cli import main  # noqa: E402  (imported once the current directory is off the path)

sys.exit(main())
