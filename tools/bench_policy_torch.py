"""PyTorch CPU baseline for diffrl's residual-MLP diffusion denoiser (run via tools/bench_policy.sh).

The network and the chain are the ones the Rust policy builds, in float32:

  step embedding  SinusoidalPosEmb(32) -> Linear(32, 64) -> Mish -> Linear(64, 32)
                  (Diffusion Policy: half = 16, freq_i = exp(-ln(10000) i / (half - 1)),
                  emb = [sin(t f), cos(t f)])
  input           h = Linear(74, H)(concat[x.flatten (16*2), t_emb (32), cond (2*5)])
  N blocks        h = h + Linear(H, H)(Mish(Linear(H, H)(h)))
  output          eps = Linear(H, 32)(Mish(h)) reshaped to [B, 16, 2]

  chain           K = 10 DDIM steps (eta = 1) over the T = 100 squaredcos_cap_v2 schedule,
                  leading spacing (t = 90, 80, ..., 0; abar_prev = 1 after t = 0). Per step:
                  x0 = clamp((x - sqrt(1-a) eps) / sqrt(a), -1, 1)
                  eps' = (x - sqrt(a) x0) / sqrt(1-a)
                  sigma = eta sqrt((1-ap)/(1-a) (1 - a/ap)),  std = max(sigma, 0.1)
                  mu = sqrt(ap) x0 + sqrt(1 - ap - sigma^2) eps'
                  x = mu + std clamp(randn, -3, 3)
                  log_prob = mean over the first Ta = 8 actions and Da of
                             clamp(log N(x; mu, std), -5, 2)
  train step      batch 256: x_t = sqrt(abar_t) x0 + sqrt(1-abar_t) noise at uniform random t,
                  MSE(eps_net(x_t, t, cond), noise), AdamW(lr 1e-4, weight_decay 1e-6),
                  backward + step.

Prints one JSON line per measurement:
  {"impl": "torch", "what": "chain_b1" | "chain_b64" | "train_b256", "median_ms": ..., "threads": N, ...}
"""

import argparse
import json
import math
import os
import statistics
import time

import torch
from torch import nn

HORIZON, ACTION_DIM = 16, 2  # Tp, Da
OBS_STEPS, OBS_DIM = 2, 5  # To, obs_dim
ACT_STEPS = 8  # Ta: the actions whose log-prob counts
STEP_EMB = 32
T_TRAIN, K_STEPS, ETA = 100, 10, 1.0
MIN_STD, NOISE_CLIP, LOGPROB_MIN, LOGPROB_MAX = 0.1, 3.0, -5.0, 2.0


def cosine_alphas_cumprod(T):
    """squaredcos_cap_v2 (betas capped at 0.999), as float64 Python floats."""

    def alpha_bar(t):
        return math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2

    out, prod = [], 1.0
    for i in range(T):
        prod *= 1 - min(1 - alpha_bar((i + 1) / T) / alpha_bar(i / T), 0.999)
        out.append(prod)
    return out


class SinusoidalPosEmb(nn.Module):
    def __init__(self, dim):
        super().__init__()
        half = dim // 2
        self.register_buffer("freqs", torch.exp(torch.arange(half) * (-math.log(10000) / (half - 1))))

    def forward(self, t):
        arg = t[:, None] * self.freqs[None, :]
        return torch.cat([arg.sin(), arg.cos()], dim=-1)


class ResidualBlock(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(hidden, hidden), nn.Mish(), nn.Linear(hidden, hidden)

    def forward(self, h):
        return h + self.fc2(self.act(self.fc1(h)))


class ResidualMlpDenoiser(nn.Module):
    def __init__(self, hidden, blocks):
        super().__init__()
        self.step_emb = nn.Sequential(SinusoidalPosEmb(STEP_EMB), nn.Linear(STEP_EMB, 64), nn.Mish(),
                                      nn.Linear(64, STEP_EMB))
        self.inp = nn.Linear(HORIZON * ACTION_DIM + STEP_EMB + OBS_STEPS * OBS_DIM, hidden)
        self.blocks = nn.Sequential(*[ResidualBlock(hidden) for _ in range(blocks)])
        self.out_act, self.out = nn.Mish(), nn.Linear(hidden, HORIZON * ACTION_DIM)

    def forward(self, x, t, cond):
        h = torch.cat([x.flatten(1), self.step_emb(t), cond], dim=-1)
        h = self.blocks(self.inp(h))
        return self.out(self.out_act(h)).view(-1, HORIZON, ACTION_DIM)


def ddim_chain(net, cond, abar):
    """One K-step eta = 1 DDIM chain; returns the final actions and per-step log-probs [K, B]."""
    b = cond.shape[0]
    x = torch.randn(b, HORIZON, ACTION_DIM)
    step = T_TRAIN // K_STEPS
    log_probs = []
    for t in range(T_TRAIN - step, -1, -step):
        a, ap = abar[t], (abar[t - step] if t - step >= 0 else 1.0)
        eps = net(x, torch.full((b,), float(t)), cond)
        x0 = ((x - math.sqrt(1 - a) * eps) / math.sqrt(a)).clamp(-1, 1)
        eps = (x - math.sqrt(a) * x0) / math.sqrt(1 - a)
        sigma = ETA * math.sqrt((1 - ap) / (1 - a) * (1 - a / ap))
        mu = math.sqrt(ap) * x0 + math.sqrt(max(1 - ap - sigma ** 2, 0.0)) * eps
        std = max(sigma, MIN_STD)
        x = mu + std * torch.randn_like(mu).clamp(-NOISE_CLIP, NOISE_CLIP)
        lp = -((x - mu) ** 2) / (2 * std ** 2) - math.log(std) - 0.5 * math.log(2 * math.pi)
        log_probs.append(lp.clamp(LOGPROB_MIN, LOGPROB_MAX)[:, :ACT_STEPS].mean(dim=(1, 2)))
    return x, torch.stack(log_probs)


def median_ms(fn, repeats, warmup):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times), min(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--repeats", type=int, default=200, help="timed repeats per measurement (train: a quarter)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    abar = cosine_alphas_cumprod(T_TRAIN)
    net = ResidualMlpDenoiser(args.hidden, args.blocks)
    # The load average and OpenMP wait policy are recorded because a busy machine distorts
    # multi-threaded numbers: with the default (spinning) policy a 2-thread run on 2 busy cores
    # can be 50x slower than 1 thread; OMP_WAIT_POLICY=PASSIVE avoids the collapse.
    common = {"impl": "torch", "threads": args.threads, "hidden": args.hidden, "blocks": args.blocks,
              "params": sum(p.numel() for p in net.parameters()), "torch": torch.__version__,
              "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default")}

    def emit(what, repeats, med, best):
        extra = {k: v for k, v in common.items() if k not in ("impl", "threads")}
        print(json.dumps({"impl": "torch", "what": what, "median_ms": med, "threads": args.threads, "min_ms": best,
                          "repeats": repeats, "load1": os.getloadavg()[0], **extra}), flush=True)

    with torch.inference_mode():
        for batch in (1, 64):
            cond = torch.randn(batch, OBS_STEPS * OBS_DIM)
            x, lp = ddim_chain(net, cond, abar)
            assert x.shape == (batch, HORIZON, ACTION_DIM) and lp.shape == (K_STEPS, batch)
            assert torch.isfinite(lp).all()
            emit(f"chain_b{batch}", args.repeats,
                 *median_ms(lambda: ddim_chain(net, cond, abar), args.repeats, warmup=max(5, args.repeats // 10)))

    batch = 256
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4, weight_decay=1e-6)
    actions = torch.rand(batch, HORIZON, ACTION_DIM) * 2 - 1
    cond = torch.randn(batch, OBS_STEPS * OBS_DIM)
    abar_t = torch.tensor(abar, dtype=torch.float32)

    def train_step():
        t = torch.randint(0, T_TRAIN, (batch,))
        noise = torch.randn_like(actions)
        a = abar_t[t].view(-1, 1, 1)
        x_t = a.sqrt() * actions + (1 - a).sqrt() * noise
        loss = nn.functional.mse_loss(net(x_t, t.float(), cond), noise)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    repeats = max(1, args.repeats // 4)
    emit(f"train_b{batch}", repeats, *median_ms(train_step, repeats, warmup=max(3, repeats // 10)))


if __name__ == "__main__":
    main()
