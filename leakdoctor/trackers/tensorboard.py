"""TensorBoard: scalars under `leakdoctor/`, the findings as text when they change state, and at the end the
verdict, the findings and the summary table as text, in the script's SummaryWriter or a new one.

    LeakDoctor(trackers=["tensorboard"])           # a new writer: ./runs/<date>_<host> (log_dir= to choose)
    LeakDoctor(trackers=[writer])                   # torch.utils.tensorboard or tensorboardX SummaryWriter
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from leakdoctor.trackers.base import PREFIX, Tracker, findings_markdown, finding_record

if TYPE_CHECKING:
    from leakdoctor.reporting.summary import Summary

__all__ = ["TensorBoard"]


def summary_writer() -> Any:
    """The SummaryWriter class: torch's, else tensorboardX's; an ImportError that says what to install."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        try:
            from tensorboardX import SummaryWriter
        except ImportError as err:
            raise ImportError("trackers=['tensorboard'] needs torch.utils.tensorboard (torch and tensorboard) or "
                              "tensorboardX: pip install leakdoctor[tensorboard]") from err
    return SummaryWriter


class TensorBoard(Tracker):
    """Writes to `writer` (the script's; flushed, never closed), or to a new SummaryWriter in `log_dir`
    (None: the writer's default, ./runs/<date>_<host>), closed at the end."""

    name = "tensorboard"
    extra = "tensorboard"

    def __init__(self, writer: Any = None, log_dir: str | None = None) -> None:
        self.writer, self.log_dir, self._own = writer, log_dir, writer is None

    def open(self) -> None:
        if self.writer is None:
            self.writer = summary_writer()(log_dir=self.log_dir)

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        for name, value in values.items():
            self.writer.add_scalar(PREFIX + name, value, step)

    def findings(self, step: int, changed: Sequence[Mapping[str, Any]]) -> None:
        self.writer.add_text(PREFIX + "findings", findings_markdown(changed), step)

    def verdict(self, summary: "Summary", plot: Path | None) -> None:
        step = summary.steps
        self.writer.add_text(PREFIX + "verdict", summary.verdict, step)
        self.writer.add_text(PREFIX + "findings", findings_markdown([finding_record(f) for f in summary.findings]),
                             step)
        self.writer.add_text(PREFIX + "summary", "    " + summary.text().replace("\n", "\n    "), step)  # code block

    def close(self) -> None:
        if self.writer is None:
            return
        if self._own:
            self.writer.close()
        else:
            self.writer.flush()
