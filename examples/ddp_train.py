#!/usr/bin/env python3
"""A deterministic data-parallel training job (DistributedDataParallel over NCCL), for
checking a multi-GPU job under cudaw against the same job without it.

Each rank trains the same model on its own data; DDP all-reduces the gradients every step.
Every few steps the job also broadcasts from rank 0 and passes a tensor round the ring
point-to-point, so that every NCCL path (all-reduce, broadcast, send/recv) is exercised.
With --print-losses rank 0 prints each step's loss as an exact hexadecimal float; at the
end every rank prints its weights' digest, so two runs compare bit for bit.

    torchrun --standalone --nproc_per_node 2 examples/ddp_train.py --steps 200 --print-losses
    cudaw run -- torchrun --standalone --nproc_per_node 2 examples/ddp_train.py --pid-dir /tmp/p

--pid-dir DIR: each rank writes DIR/rank<N>.pid once training starts (scripts find the ranks).
--hold-gib G: each rank also holds G GiB of a known pattern, checked word for word at the end.
--step-sleep S: sleep S seconds after each step (so a script can pause at many instants).
"""
import argparse
import hashlib
import os
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


class Net(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.fc1 = torch.nn.Linear(16 * 32 * 32, width)
        self.fc2 = torch.nn.Linear(width, width)
        self.out = torch.nn.Linear(width, 10)

    def forward(self, x):
        x = torch.relu(self.conv(x)).flatten(1)
        x = torch.nn.functional.gelu(self.fc1(x))
        x = torch.nn.functional.gelu(self.fc2(x))
        return self.out(x)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--print-losses", action="store_true")
    p.add_argument("--pid-dir")
    p.add_argument("--hold-gib", type=float, default=0)
    p.add_argument("--step-sleep", type=float, default=0)
    p.add_argument("--extra-every", type=int, default=5,
                   help="every N steps also broadcast and pass a tensor round the ring (0: never)")
    args = p.parse_args()

    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)

    torch.manual_seed(0)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True)

    model = DDP(Net(args.width).to(dev), device_ids=[local])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1 + rank)
    data = torch.randn(8, args.batch, 3, 32, 32, generator=g).to(dev)
    labels = torch.randint(0, 10, (8, args.batch), generator=g).to(dev)

    def pattern(out, start):
        # A known pattern, made a chunk at a time (no temporaries as large as the buffer).
        torch.arange(start, start + out.numel(), dtype=torch.int64, device=dev, out=out)
        out.add_(rank).mul_(2654435761).remainder_(1 << 61)

    chunk = 1 << 27
    held = None
    if args.hold_gib > 0:
        n = int(args.hold_gib * (1 << 30)) // 8
        held = torch.empty(n, dtype=torch.int64, device=dev)
        for s in range(0, n, chunk):
            pattern(held[s:s + chunk], s)
        torch.cuda.synchronize()
    if args.pid_dir:
        os.makedirs(args.pid_dir, exist_ok=True)
        path = os.path.join(args.pid_dir, f"rank{rank}.pid")
        with open(path + ".tmp", "w") as f:
            f.write(f"{os.getpid()}\n")
        os.replace(path + ".tmp", path)

    ring = torch.zeros(4096, device=dev)
    digest = hashlib.sha256()
    for i in range(args.steps):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(data[i % 8]), labels[i % 8])
        loss.backward()
        opt.step()
        if args.extra_every and i % args.extra_every == 0:
            # broadcast from rank 0, then a point-to-point pass round the ring
            b = torch.full((1024,), float(i), device=dev) if rank == 0 else torch.empty(1024, device=dev)
            dist.broadcast(b, 0)
            ring += b[:1].sum() + rank
            if world > 1:
                got = torch.empty_like(ring)
                ops = [dist.P2POp(dist.isend, ring, (rank + 1) % world),
                       dist.P2POp(dist.irecv, got, (rank - 1) % world)]
                for r in dist.batch_isend_irecv(ops):
                    r.wait()
                ring = got * 0.5
        v = loss.item()
        digest.update(v.hex().encode())
        if args.print_losses and rank == 0:
            print(f"step {i} loss {v.hex()}", flush=True)
        if args.step_sleep:
            time.sleep(args.step_sleep)

    h = hashlib.sha256()
    for t in model.state_dict().values():
        h.update(t.detach().cpu().numpy().tobytes())
    h.update(ring.cpu().numpy().tobytes())
    line = f"rank {rank} losses_sha256 {digest.hexdigest()[:16]} weights_sha256 {h.hexdigest()[:16]}"
    if held is not None:
        want = torch.empty(min(chunk, held.numel()), dtype=torch.int64, device=dev)
        intact = True
        for s in range(0, held.numel(), chunk):
            part = held[s:s + chunk]
            pattern(want[:part.numel()], s)
            intact = intact and bool(torch.equal(part, want[:part.numel()]))
        line += f" held_intact {intact}"
        del want
    # one line per rank, in rank order
    for r in range(world):
        if r == rank:
            print(line, flush=True)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
