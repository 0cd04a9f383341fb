"""The version of anyshape: recorded in artifacts, part of every cache key."""

__version__ = "0.1.0"
