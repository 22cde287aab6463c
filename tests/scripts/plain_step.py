"""A plain Python loop whose step keeps every record in a module-level list (tests/test_run.py runs it
with `leakdoctor run --step-on train_step`, or `--step-on plain_steps:train_step` with `module`)."""

import sys

history = []


def train_step(i):
    history.append([float(i)] * 20000)  # KEPT: every step's record, forever
    return i


if __name__ == "__main__":
    if sys.argv[1:] == ["module"]:
        import plain_steps

        for i in range(150):
            plain_steps.train_step(i)
    else:
        for i in range(150):
            train_step(i)
    print("done")
