"""What a user can fix, told apart from a bug.

Every error a user can fix (a config key, a data file, a site, a command's input) derives from
`UserError`: the command line prints its message as one line and exits 2. Anything else is a
bug in fedcare or in a study's code: the command line shows its traceback and exits 1.
`FEDCARE_TRACEBACK=1` (or `fedcare --traceback ...`) shows the traceback of user errors too.

Subclasses keep the built-in class they had as a second base (`ConfigError(UserError,
ValueError)`), so code that catches `ValueError` around a reader still catches them. A
`ValueError` that is not a `UserError` is a bug, however it reads.
"""

from __future__ import annotations

import os

TRACEBACK_VARIABLE = "FEDCARE_TRACEBACK"


class UserError(Exception):
    """Something the user can fix; its message names the file, key or option and the problem."""


class InputError(UserError, ValueError):
    """A value or file a user gave that fedcare cannot use (a command's option, a run
    directory, a generator's setting), outside the config, data and site errors."""


def tracebacks_wanted() -> bool:
    """Whether user errors show their traceback too (`FEDCARE_TRACEBACK` set, and not to 0)."""
    return os.environ.get(TRACEBACK_VARIABLE, "") not in ("", "0")
