"""envport: one declarative env spec, rendered, built and proved on every backend."""

__version__ = "0.1.0"
