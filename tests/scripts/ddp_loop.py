"""A plain PyTorch DDP loop for torchrun (gloo on CPU), in which rank 1 alone leaks: it keeps 1 MiB a step
in a list attribute of the model (tests/test_torchrun.py).

    torchrun --nproc-per-node 2 --standalone ddp_loop.py FOLDER [--doctor] [--steps N] [--fail-at STEP]
                                                             [--kill-at STEP]

--doctor: the script makes the torch LeakDoctor itself (summary FOLDER/leaks.json); without it the loop
knows nothing of leakdoctor (run it under `leakdoctor run`). --fail-at: rank 1 raises MemoryError at that
step, as a rank that ran out of memory does; --kill-at: rank 1 SIGKILLs itself at that step, as the
kernel's out-of-memory killer would. The script ends as DDP scripts do, by destroying its
process group; each rank prints its last step."""

import argparse
import contextlib
import os
import signal

import torch
import torch.distributed as dist

CHUNK = 2**17  # float64 items: 1 MiB a step


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder")
    parser.add_argument("--doctor", action="store_true")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--fail-at", type=int, default=0)
    parser.add_argument("--kill-at", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo")  # torchrun's environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank = dist.get_rank()
    net = torch.nn.Linear(32, 1)
    net.hoard = []  # a list attribute of the model, which the doctor counts
    model = torch.nn.parallel.DistributedDataParallel(net)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    doctor = None
    if args.doctor:
        from leakdoctor.callbacks.torch import LeakDoctor

        doctor = LeakDoctor(model=model, optimizer=optimizer, summary_path=os.path.join(args.folder, "leaks.json"),
                            verbose=False, warmup=5, window=3, overhead=1.0)
    step = 0
    with doctor if doctor is not None else contextlib.nullcontext():
        for step in range(1, args.steps + 1):
            loss = model(torch.randn(16, 32)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()  # DDP's gradient all_reduce: the ranks step in lockstep
            optimizer.step()
            if rank == 1:
                net.hoard.append(torch.ones(CHUNK, dtype=torch.float64))  # KEPT: the leak, on rank 1 only
                if step == args.fail_at:
                    raise MemoryError(f"rank 1 ran out of memory at step {step}")
                if step == args.kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)
            if doctor is not None:
                doctor.step()
    print(f"rank {rank}: {step} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
