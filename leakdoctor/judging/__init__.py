"""Judging: is a series growing, what makes it grow, and did a remedy stop it.

Data flows: the trend statistics on window minima (leakdoctor/base/trend.py: the monitor's suspicion) →
clinic.py (once a metric is suspect: investigate, diagnose, treat, verify) → investigate.py (a bounded
forensic window and its cleanup ladder, gathered as the ground floor's Evidence, base/evidence.py) → diagnosis.py (the rules, the integrations' and the
generic ones, from Evidence to findings). stopped.py judges whether a growth stopped by itself: the clinic
asks during the run, and the summary again at its end (leakdoctor/reporting/).
"""
