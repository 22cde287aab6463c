"""A loop over one of planted_torch.py's steps: `planted_loop.py {graphs|hooks} STEPS [--doctor SUMMARY]`.
With --doctor the loop steps the torch callback (leakdoctor.callbacks.torch.LeakDoctor) itself and writes
its summary to SUMMARY; without, it is a plain script for `leakdoctor run`."""

import sys

import planted_torch

bug, steps = sys.argv[1], int(sys.argv[2])
step = getattr(planted_torch, f"{bug}_step")
if "--doctor" in sys.argv:
    from leakdoctor.callbacks.torch import LeakDoctor

    path = sys.argv[sys.argv.index("--doctor") + 1]
    with LeakDoctor(model=planted_torch.model, optimizer=planted_torch.optimizer, overhead=1.0,
                    memory_limit="4GiB", summary_path=path) as doctor:
        for _ in range(steps):
            step()
            doctor.step()
else:
    for _ in range(steps):
        step()
print(f"trained {steps} steps")
