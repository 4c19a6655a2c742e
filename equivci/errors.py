"""User-facing errors: one paragraph naming the file, key or function and the fix."""

from __future__ import annotations


class EquivciError(Exception):
    """An error caused by the user's input (manifest, entrypoints, capture).

    The message is the whole explanation shown to the user; the CLI prints it without a
    traceback (unless --debug) and exits with code 2.
    """
