"""The integrations: one internal module per framework (`_process.integration()`, `_torch.integration(model)`,
...), each a factory of the plain data an integration hands the engine: probes, forensics, cleanups, rules and
targets.

Those types (MetricSpec, Probe, FunctionProbe, Forensic, Cleanup, Integration) are the ground floor's
(leakdoctor/_base/metric.py, leakdoctor/_base/integration.py): the reading and the judging read them without importing any integration.
They are exported here too, where integrations and users have always imported them.
"""

from __future__ import annotations

from leakdoctor._base.integration import Cleanup, Forensic, Integration
from leakdoctor._base.metric import UNITS, FunctionProbe, MetricSpec, Probe

__all__ = ["UNITS", "MetricSpec", "Probe", "FunctionProbe", "Forensic", "Cleanup", "Integration"]
