"""The one exception type towerbench shows to users."""


class TowerbenchError(Exception):
    """A problem with the user's input or environment, stated in one line.

    The message names the file or parameter and what is wrong with it; the CLI prints it
    without a traceback and exits non-zero.
    """
