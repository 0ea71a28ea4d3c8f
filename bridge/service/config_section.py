"""The base of every section of the configuration file (``kubernetes:``, ``checkpoint:`` …)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["Section"]


class Section(BaseModel):
    # A misspelled key is an error, not a silently ignored setting; a loaded configuration is a value.
    model_config = ConfigDict(extra="forbid", frozen=True)
