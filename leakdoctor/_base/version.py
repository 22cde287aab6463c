"""leakdoctor's version (the package's `__version__`, written into every summary)."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
