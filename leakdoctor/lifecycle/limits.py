"""Where a run runs out of memory, under its old module: it lives beside the process integration that reads
resident memory against it (leakdoctor/integrations/limits.py)."""

from __future__ import annotations

from leakdoctor.integrations.limits import *  # noqa: F403 - the old name of the module, kept for old imports
from leakdoctor.integrations.limits import __all__ as __all__
