"""The run's lifecycle: what happens to the run itself, from start to end, whatever was found.

The guard that runs every part so that one that raises is switched off, never the loop, is the ground
floor's (leakdoctor/_base/guard.py); where the run really runs out of memory, the process integration's
(leakdoctor/integrations/_limits.py). stopping.py (on_limit) acts on a leak projected to reach it: warn,
stop, or call the user's function. heartbeat.py writes the summary while the run goes (and at once past the
oom_watermark), so a SIGKILL leaves it on disk; termination.py writes it on SIGTERM; oom.py recognises an
out-of-memory error and writes its post-mortem.
"""
