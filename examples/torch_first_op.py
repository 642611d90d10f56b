#!/usr/bin/env python3
"""Times `import torch` plus the first CUDA operation (context creation, first kernel)."""
import time

t0 = time.perf_counter()
import torch  # noqa: E402

t1 = time.perf_counter()
x = torch.ones(1024, device="cuda")
y = (x * 2).sum().item()
assert y == 2048.0
t2 = time.perf_counter()
print(f"first_op seconds={t2 - t0:.4f} import={t1 - t0:.4f} first_op={t2 - t1:.4f}")
