"""Errors raised while reading dataset files.

A missing file raises the built-in :class:`FileNotFoundError` (with the expected file names);
a file that exists but is not what its format promises raises :class:`DataFormatError`; a
pickle that asks for anything beyond rebuilding numpy arrays raises :class:`UnsafePickleError`.
"""

from __future__ import annotations

import pickle

from fedsafe.core.errors import FedsafeError


class DataFormatError(FedsafeError, ValueError):
    """A dataset file is malformed: wrong magic number, dtype, shape, length or contents."""


class UnsafePickleError(pickle.UnpicklingError, DataFormatError):
    """A pickle referenced a global outside the allow-list needed to rebuild numpy arrays
    (also a :class:`DataFormatError`, so callers that handle malformed files handle it)."""
