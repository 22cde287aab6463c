"""The guard that never lets the doctor hurt the run, under its old module: it lives on the ground floor
(leakdoctor/base/guard.py), since every stage calls its parts through it."""

from __future__ import annotations

from leakdoctor.base.guard import ENGINE, Guard, LeakDoctorWarning, warn

__all__ = ["ENGINE", "LeakDoctorWarning", "Guard", "warn"]
