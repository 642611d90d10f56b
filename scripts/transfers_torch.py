"""Host-to-device time per batch of a PyTorch DataLoader (issue 29).

    python3 scripts/transfers_torch.py pin|nopin [BATCHES]

Prints "h2d_ms_per_batch MS" (the median over the batches after the first five) and
"checksum X". Batches of 64 images of 3x224x224 float32 (38.5 MB each) from a
TensorDataset, num_workers=0: with nopin every batch is a fresh pageable tensor (cudaw
copies it through its staging; too short-lived to be pinned), with pin the DataLoader
copies it into page-locked memory first (not counted here: only the copy to the GPU is).
"""
import statistics
import sys
import time

import torch
from torch.utils.data import DataLoader, TensorDataset


def main():
    pin = sys.argv[1] == "pin"
    batches = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    batch = 64
    torch.manual_seed(0)
    ds = TensorDataset(torch.randn(batches * batch, 3, 224, 224))
    dl = DataLoader(ds, batch_size=batch, pin_memory=pin, num_workers=0)
    torch.empty(1, device="cuda")
    times, checksum = [], 0.0
    for (x,) in dl:
        torch.cuda.synchronize()
        t = time.perf_counter()
        y = x.to("cuda", non_blocking=False)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
        checksum += float(y[:, 0, 0, 0].sum())
    print(f"h2d_ms_per_batch {1000 * statistics.median(times[5:]):.3f}")
    print(f"checksum {checksum:.4f}")


if __name__ == "__main__":
    main()
