"""Judging: is a series growing, what makes it grow, and did a remedy stop it.

Data flows: suspicion.py (on each window close, is a metric suspect: the trend statistics of
leakdoctor/_base/trend.py on the window minima the monitor reads) → clinic.py (once a metric is suspect:
investigate, diagnose, treat, verify) → investigate.py (a bounded forensic window and its cleanup ladder,
gathered as the ground floor's Evidence, _base/evidence.py) → diagnosis.py (the rules, the integrations' and
the generic ones, from Evidence to findings). stopped.py judges whether a growth stopped by itself: the
clinic asks during the run, and the summary again at its end (leakdoctor/reporting/). sites.py keeps the
allocation sites the investigations saw grow, for an out-of-memory post-mortem.
"""
