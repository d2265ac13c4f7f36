"""One exception type for every problem a user can fix (bad prompt, bad setting, missing model).

The CLIs print these as a one-line message (`run_command`) and the app shows them in the page; anything
else is a bug and keeps its traceback.
"""

import sys


class UserError(ValueError):
    """An input or setting the user can correct; the message says how."""


def run_command(command, *args) -> int:
    """Run a command-line entry point: a UserError becomes `error: ...` on stderr and exit status 2.

    Both `python -m dartree` and `python -m dartree.train` end through here, so they fail the same way.
    """
    try:
        return command(*args)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
