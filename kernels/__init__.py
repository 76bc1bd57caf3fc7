from ._native import __version__  # noqa: F401
