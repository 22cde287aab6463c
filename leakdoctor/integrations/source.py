"""The user's code as seen from inside the doctor, under its old module: it lives on the ground floor
(leakdoctor/base/source.py), since the guard's warnings name the user's line with it."""

from __future__ import annotations

from leakdoctor.base.source import *  # noqa: F403 - the old name of the module, kept for old imports
from leakdoctor.base.source import __all__ as __all__
