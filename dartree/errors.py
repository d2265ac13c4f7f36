"""One exception type for every problem a user can fix (bad prompt, bad setting, missing model).

The CLI prints these as a one-line message and the app shows them in the page; anything else is a bug
and keeps its traceback.
"""


class UserError(ValueError):
    """An input or setting the user can correct; the message says how."""
