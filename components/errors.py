"""The one exception type a user can act on: the CLI prints its message without a traceback."""
from components.redact import redact_url


class UserError(Exception):
    """Something the user can fix: a bad path, a bad param, a missing extra. The message says how.

    Messages often quote a URL (an endpoint that did not answer); its password and tokens are masked here, so no
    message, log line or CLI output built from a UserError shows them.
    """

    def __init__(self, *args):
        super().__init__(*(redact_url(arg) if isinstance(arg, str) else arg for arg in args))
