"""The names a summary file is made of, which a Finding checks (findings.py), the Summary writes
(reporting/summary.py) and a reader checks before it trusts a file (reporting/loading.py): the schema name,
the causes a finding may name, its states and severities."""

from __future__ import annotations

__all__ = ["SCHEMA", "OLD_SCHEMAS", "CAUSES", "STATES", "SEVERITIES", "MAJOR", "MINOR"]

#: The schema a summary is written in. 2: a finding's evidence and recommendation and the summary's notes
#: are records of the message catalogue ({"code", "params"}, _base/messages.py), a finding's location is
#: {"file", "line", "function", "holder"}.
SCHEMA = "leakdoctor.summary/2"
#: Schemas still read (Summary.load, `leakdoctor report`): 1 held those as text.
OLD_SCHEMAS = ("leakdoctor.summary/1",)

CAUSES: dict[str, str] = {
    "lazy_graph": "a lazy computation graph chains across steps and is never evaluated",
    "compile_cache": "a function is compiled or traced again every step",
    "hook_accumulation": "hooks are registered repeatedly and never removed",
    "retained_graph": "tensors that still hold their autograd graph are kept across steps",
    "container_growth": "a list, dict or set keeps growing",
    "python_objects": "Python objects accumulate",
    "device_arrays": "arrays on the device accumulate",
    "allocator_cache": "an allocator cache holds freed memory (not a leak)",
    "dataloader_workers": "data-loading worker processes grow",
    "native_memory": "native memory grows and nothing else explains it",
}


#: A finding's final state: a leak still growing; remedied (an effective remedy); minor (a proven cause too
#: slow to matter over the horizon: listed, the verdict stays clean); benign (not a leak: an allocator
#: cache); withdrawn (a live alert that the end of the run did not bear out, with its `reason`).
STATES = ("leak", "remedied", "minor", "benign", "withdrawn")
#: major: material over the horizon (the verdict is leak); minor: not. The one place the severities are
#: written: the summary's findings, `--fail-on-leak[=minor]` and the pytest plugin's `fail_on` use these.
MAJOR, MINOR = "major", "minor"
SEVERITIES = (MAJOR, MINOR)
