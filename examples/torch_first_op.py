#!/usr/bin/env python3
"""Times `import torch` plus the first CUDA operation (context creation, first kernel)."""
import time

t0 = time.perf_counter()
import torch  # noqa: E402

x = torch.ones(1024, device="cuda")
y = (x * 2).sum().item()
assert y == 2048.0
print(f"first_op seconds={time.perf_counter() - t0:.4f}")
