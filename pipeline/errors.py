"""The project's named errors. Each names what is wrong and where."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration or invocation problem, raised before any work starts."""


class InvalidRecordError(ValueError):
    """A record that must not be written: names the image and the field."""

    def __init__(self, image_id: object, field: str, reason: str):
        self.image_id = image_id
        self.field = field
        self.reason = reason
        super().__init__(f"image {image_id!r}: field {field!r}: {reason}")


class StoreError(RuntimeError):
    """A feature store on disk is missing, incomplete or corrupt."""


class UnsafePickleError(ValueError):
    """A pickle asked for something other than numpy arrays and plain values."""
