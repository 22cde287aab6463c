"""The trend statistics, under their old name: they live on the ground floor (leakdoctor/base/trend.py), since
the reading (the monitor's series, the sampler thread) and the reporting use them as much as the judging."""

from __future__ import annotations

from leakdoctor.base.trend import *  # noqa: F403 - the old name of the module, kept for old imports
from leakdoctor.base.trend import __all__ as __all__
from leakdoctor.base.trend import _CACHED_PAIRS as _CACHED_PAIRS
from leakdoctor.base.trend import _cached_pairs as _cached_pairs
from leakdoctor.base.trend import _inversion_cdf as _inversion_cdf
