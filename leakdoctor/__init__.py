"""leakdoctor: drop-in training callbacks that tell a real memory leak from warm-up, caches and spikes,
name its cause and place, apply a remedy when allowed, verify it, and write a leak summary.

    from leakdoctor import LeakDoctor
    with LeakDoctor(remedies="safe", summary_path="leaks.json") as doctor:
        for batch in data:
            train_step(batch)
            doctor.step()

Framework callbacks live in `leakdoctor.callbacks.<framework>`; no framework is imported here.
"""

__version__ = "0.1.0"

from leakdoctor.doctor import LeakDoctor  # noqa: E402
from leakdoctor.guard import LeakDoctorWarning  # noqa: E402
from leakdoctor.summary import Finding, Summary  # noqa: E402

__all__ = ["LeakDoctor", "LeakDoctorWarning", "Finding", "Summary", "__version__"]
