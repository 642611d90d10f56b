#!/usr/bin/env python3
"""A small GPT-style transformer trained deterministically, for checking cudaw against a
native run (scripts/migrate_check.py moves it between GPUs while it trains).

Token and position embeddings, pre-norm blocks of causal self-attention and a GELU MLP,
a final LayerNorm and a language-model head; the blocks, the final norm and the head are
one torch.compile'd module (Triton kernels for the norms, the softmax and the pointwise
parts, cuBLAS for the matmuls); AdamW with weight decay. The embeddings stay outside the
compiled module: their backward is an accumulating scatter, which eager PyTorch does
deterministically (torch.use_deterministic_algorithms). With --print-losses each step's
loss is printed as an exact hexadecimal float, so two runs can be compared bit for bit.
The same options as examples/torch_train.py where they overlap:

    python3 examples/torch_gpt.py --steps 20 --print-losses
    python3 examples/torch_gpt.py --steps 3000 --print-losses --hold-gib 1 --pid-file /tmp/gpt.pid
    python3 examples/torch_gpt.py --bench --steps 200
"""
import argparse
import hashlib
import math
import os
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


class Block(torch.nn.Module):
    def __init__(self, width, heads, context):
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.ln2 = torch.nn.LayerNorm(width)
        self.fc = torch.nn.Linear(width, 4 * width)
        self.fc2 = torch.nn.Linear(4 * width, width)
        self.register_buffer("causal", torch.tril(torch.ones(context, context, dtype=torch.bool)),
                             persistent=False)

    def forward(self, x):
        b, t, c = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q = q.view(b, t, h, c // h).transpose(1, 2)
        k = k.view(b, t, h, c // h).transpose(1, 2)
        v = v.view(b, t, h, c // h).transpose(1, 2)
        # Attention written out (not scaled_dot_product_attention, whose fused backward
        # kernels are not all deterministic): matmuls, a mask and a softmax.
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // h))
        att = att.masked_fill(~self.causal[:t, :t], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc(self.ln2(x))))


class Body(torch.nn.Module):
    """What torch.compile compiles: the blocks, the final norm and the head."""

    def __init__(self, vocab, width, heads, layers, context):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(width, heads, context) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, vocab, bias=False)

    def forward(self, x):
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


class GPT(torch.nn.Module):
    def __init__(self, vocab, width, heads, layers, context):
        super().__init__()
        self.wte = torch.nn.Embedding(vocab, width)
        self.wpe = torch.nn.Embedding(context, width)
        self.body = Body(vocab, width, heads, layers, context)

    def forward(self, idx, body):
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        return body(self.wte(idx) + self.wpe(pos))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile (no Triton)")
    p.add_argument("--print-losses", action="store_true")
    p.add_argument("--bench", action="store_true", help="time steps after 10 warm-up steps")
    p.add_argument("--hold-gib", type=float, default=0,
                   help="also hold a buffer of this many GiB (a known pattern, checked at the end)")
    p.add_argument("--pid-file", help="write this process's PID here once training starts")
    args = p.parse_args()

    torch.manual_seed(0)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True)
    # Inductor picks some kernels' launch configurations by timing them: two runs could pick
    # differently and sum in another order. Its deterministic mode (where this PyTorch has
    # it) does not time them; the configurations chosen are also cached, and two runs that
    # share TORCHINDUCTOR_CACHE_DIR use the same ones.
    import torch._inductor.config as inductor_config
    if hasattr(inductor_config, "deterministic"):
        inductor_config.deterministic = True

    dev = torch.device("cuda")
    model = GPT(args.vocab, args.width, args.heads, args.layers, args.context).to(dev)
    body = model.body if args.no_compile else torch.compile(model.body)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    g = torch.Generator().manual_seed(1)
    # Eight fixed batches of a learnable sequence (each token a function of the two before
    # it, plus noise), so the loss falls.
    base = torch.randint(0, args.vocab, (8, args.batch, 2), generator=g)
    seq = [base[..., 0], base[..., 1]]
    for _ in range(args.context - 1):
        noise = torch.randint(0, 8, (8, args.batch), generator=g)
        seq.append((seq[-1] * 3 + seq[-2] + noise) % args.vocab)
    data = torch.stack(seq, dim=-1).to(dev)  # 8 x batch x (context + 1)

    def step(i):
        opt.zero_grad(set_to_none=True)
        batch = data[i % 8]
        logits = model(batch[:, :-1], body)
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), batch[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        return loss

    if args.bench:
        for i in range(10):
            step(i)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(args.steps):
            step(i)
        torch.cuda.synchronize()
        print(f"bench ms_per_step={(time.perf_counter() - t0) * 1000 / max(1, args.steps):.4f} steps={args.steps}")
        return

    held = None
    if args.hold_gib > 0:
        n = int(args.hold_gib * (1 << 30)) // 8
        held = torch.arange(n, dtype=torch.int64, device=dev) * 2654435761 % (1 << 61)
        torch.cuda.synchronize()
    if args.pid_file:
        with open(args.pid_file + ".tmp", "w") as f:
            f.write(f"{os.getpid()}\n")
        os.replace(args.pid_file + ".tmp", args.pid_file)

    losses = []
    for i in range(args.steps):
        loss = step(i)
        losses.append(loss.item())
        if args.print_losses:
            print(f"step {i} loss {losses[-1].hex()}", flush=True)
    h = hashlib.sha256()
    for t in model.state_dict().values():
        h.update(t.detach().cpu().numpy().tobytes())
    for st in opt.state.values():
        for v in st.values():
            if torch.is_tensor(v):
                h.update(v.detach().cpu().numpy().tobytes())
    if held is not None:
        n = held.numel()
        want = torch.arange(n, dtype=torch.int64, device=dev) * 2654435761 % (1 << 61)
        print(f"held {args.hold_gib:g} GiB intact {bool(torch.equal(held, want))}")
        del want
    print(f"final loss {losses[-1]:.6f} weights_and_adamw_sha256 {h.hexdigest()[:16]}")
    print(f"allocator {torch.cuda.memory_allocated() >> 20} MiB allocated, "
          f"{torch.cuda.memory_reserved() >> 20} MiB reserved", file=sys.stderr)


if __name__ == "__main__":
    main()
