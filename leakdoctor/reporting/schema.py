"""The summary file's names, under their old module: they live on the ground floor (leakdoctor/base/schema.py),
since a Finding checks its cause against them."""

from __future__ import annotations

from leakdoctor.base.schema import CAUSES, MAJOR, MINOR, OLD_SCHEMAS, SCHEMA, SEVERITIES, STATES

__all__ = ["SCHEMA", "OLD_SCHEMAS", "CAUSES", "STATES", "SEVERITIES", "MAJOR", "MINOR"]
