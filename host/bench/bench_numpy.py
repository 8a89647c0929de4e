# host/bench/bench_numpy.py: the NumPy backend's training step against PyTorch's, one thread each.
#   python host/bench/bench_numpy.py [rounds]
# The model is make bench's E=64 block: Dense(16,64) -> Attention(64,4) -> GlobalAvgPool ->
# Dense(64,4), batch 8 x 32 tokens, cross-entropy, Adam (lr 1e-3): forward, backward and the
# optimizer step. Both run in this process with one thread (OpenBLAS/MKL/OMP and torch's own);
# the figure is the fastest of `rounds` rounds of 20 steps each, in CPU time of this process (on
# a shared machine, wall time also counts the waits for a core).
import os

for _k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_k] = "1"

import sys  # noqa: E402
import time  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "lib"))

B, S, F, E, H, C = 8, 32, 16, 64, 4, 4
STEPS = 20


def _microformer():
    import microformer as mf
    mf.set_backend("numpy")
    mf.seed(2)
    model = mf.Sequential([mf.Dense(F, E), mf.Attention(E, H), mf.GlobalAvgPool(), mf.Dense(E, C)])
    opt = mf.Adam(model, lr=1e-3)
    loss_fn = mf.CrossEntropyLoss()
    x = mf.Tensor((B, S, F))
    for i in range(B * S * F):
        x.data[i] = ((i * 7919) % 2001 - 1000) / 1000.0
    labels = [i % C for i in range(B)]

    def step():
        opt.zero_grad()
        loss_fn.forward(model.forward(x), labels)
        model.backward(loss_fn.backward())
        opt.step()
    return step


def _torch():
    import torch
    torch.set_num_threads(1)
    torch.manual_seed(2)

    class Block(torch.nn.Module):
        # the same math: q k v o projections with biases, per-head softmax(q k^T / sqrt(hs)) v
        def __init__(self):
            super().__init__()
            self.inp = torch.nn.Linear(F, E)
            self.q = torch.nn.Linear(E, E)
            self.k = torch.nn.Linear(E, E)
            self.v = torch.nn.Linear(E, E)
            self.o = torch.nn.Linear(E, E)
            self.out = torch.nn.Linear(E, C)

        def forward(self, x):
            h = self.inp(x)
            def split(t):
                return t.view(B, S, H, E // H).transpose(1, 2)
            a = torch.softmax(split(self.q(h)) @ split(self.k(h)).transpose(-1, -2) / (E // H) ** 0.5, dim=-1)
            ctx = (a @ split(self.v(h))).transpose(1, 2).reshape(B, S, E)
            return self.out(self.o(ctx).mean(dim=1))

    model = Block()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.tensor([((i * 7919) % 2001 - 1000) / 1000.0 for i in range(B * S * F)]).view(B, S, F)
    labels = torch.tensor([i % C for i in range(B)])

    def step():
        opt.zero_grad()
        loss_fn(model(x), labels).backward()
        opt.step()
    return step


def _time(step, rounds):
    for _ in range(3):
        step()
    best = None
    for _ in range(rounds):
        t0 = time.process_time()
        for _ in range(STEPS):
            step()
        dt = (time.process_time() - t0) / STEPS
        best = dt if best is None or dt < best else best
    return best


def numpy_vs_torch(rounds=15):
    """ms per training step of the E=64 block: the NumPy backend and PyTorch, one thread each,
    alternating rounds; returns (numpy ms, torch ms)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        print("numpy vs torch: torch is not installed; no figure", flush=True)
        return None
    steps = {"numpy": _microformer(), "torch": _torch()}
    best = {}
    for _ in range(rounds):
        for name, step in steps.items():
            t = _time(step, 1)
            best[name] = t if name not in best or t < best[name] else best[name]
    n, t = best["numpy"] * 1e3, best["torch"] * 1e3
    print("E=64 block training step (B=8, S=32, fwd + bwd + Adam), one thread: NumPy backend %.3f ms,"
          " PyTorch %.3f ms: x%.2f" % (n, t, n / t), flush=True)
    return n, t


if __name__ == "__main__":
    numpy_vs_torch(int(sys.argv[1]) if len(sys.argv) > 1 else 15)
