"""User-facing errors: the CLI prints them without a traceback and exits with status 2."""


class ArpoError(Exception):
    """A problem with the user's input or environment, phrased so they can fix it
    (name the file, line, key or flag, and what to do)."""


def require(ok: bool, key: str, what: str) -> None:
    """Config validation in one line: ArpoError('<key>: <what>') unless ok."""
    if not ok:
        raise ArpoError(f"{key}: {what}")
