"""The one exception type for user mistakes: the CLI prints its message without a traceback."""


class DraftsmithError(Exception):
    """A problem the user can fix; the message names the problem and the fix."""
