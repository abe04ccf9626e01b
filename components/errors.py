"""The one exception type a user can act on: the CLI prints its message without a traceback."""


class UserError(Exception):
    """Something the user can fix: a bad path, a bad param, a missing extra. The message says how."""
