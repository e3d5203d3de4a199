"""The one base class of the errors this package raises for bad input or a bad run directory.

Every command (`keras_transformer.cli`: `kt-train`, `kt-export`, `kt-translate`, ...) catches
`KerasTransformerError`, prints its message (which names the file, line or flag) and exits
with status 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class KerasTransformerError(Exception):
    """Bad input, configuration or run directory; the message says what and where."""


__all__ = ["KerasTransformerError"]
