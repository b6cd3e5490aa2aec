"""caiplatform: an agent platform delivered as a Python library."""

__version__ = "0.1.0"
