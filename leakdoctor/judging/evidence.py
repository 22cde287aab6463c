"""What an investigation hands the rules, and what a rule is, under their old module: they live on the ground
floor (leakdoctor/base/evidence.py), since the integrations' rules and the judging share them."""

from __future__ import annotations

from leakdoctor.base.evidence import ACCOUNTED, HEAP, MAPPED, RSS, Evidence, Ladder, Rule

__all__ = ["HEAP", "MAPPED", "RSS", "ACCOUNTED", "Ladder", "Evidence", "Rule"]
