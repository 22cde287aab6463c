"""Reading the counters: what a sampled step reads, and where the readings are kept.

Data flows: sampling.py (which steps are sampled; the per-step path, the doctor's own time) → probing.py
(the probes due on this sample, each on its own schedule; the user's `doctor.watch` gauges among them,
paced and timed out by gauges.py) → monitor.py (each metric's series.py, in bounded memory, and which
metrics are free to investigate), which hands the windows that closed to the judging (leakdoctor/_judging/),
whose suspicion.py decides whether a metric is suspect. pacing.py
sets how many steps apart a sample, or anything else that costs time, comes to stay within its budget.
thread.py watches resident memory off the training thread, window by window, and wakes the training
thread when it rises.
"""
