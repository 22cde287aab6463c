"""Reporting: the run told as a summary, once it ends and while it goes.

Data flows: _report.py (the summary built from what the monitor and the clinic hold) → summary.py (the
Summary, made of the ground floor's Finding, and their JSON whose names are _base/schema.py's, and their
text) → _plot.py (a PNG), _html.py (one self-contained HTML page, its charts drawn by _svg.py) and _exporter.py
(Prometheus /metrics); _ranks.py merges the ranks' summaries of a distributed run into one; loading.py reads
a summary file back, checked, for Summary.load and `leakdoctor report`.
"""
