"""Errors a user can cause and fix. The CLI prints their message as one line and exits 2."""

from __future__ import annotations


class UserError(Exception):
    """Bad input: a missing or malformed file, an impossible option, an infeasible budget.

    The message is one sentence naming the file/field/value and what was expected.
    """

    exit_status = 2


class ModelFormatError(UserError):
    """A model file or bundle is not what it claims to be (bad magic, truncated, corrupted)."""


class UnsupportedModelError(UserError):
    """A well-formed model that edgeflash cannot run (unknown architecture or tensor type)."""


class IntegrityError(ModelFormatError):
    """Bytes read back do not match the checksum recorded when they were written."""
