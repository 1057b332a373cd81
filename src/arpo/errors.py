"""User-facing errors: the CLI prints them without a traceback and exits with status 2."""


class ArpoError(Exception):
    """A problem with the user's input or environment, phrased so they can fix it
    (name the file, line, key or flag, and what to do)."""
