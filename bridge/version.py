"""The package version, in a module of its own so that any layer can name it without importing the
package ``__init__`` (which re-exports every layer)."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
