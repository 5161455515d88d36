"""Writes diffusers DDPM/DDIM scheduler reference vectors for diffrl's denoiser tests.

Run through tools/diffusers_vectors.sh (it creates the pinned `torch` virtualenv). The output,
assets/testdata/diffusers_vectors.json, is committed; the Rust tests need no Python.

Samples, model outputs and noise are float64 tensors, but diffusers keeps betas and
alphas_cumprod in float32 and computes every scalar coefficient (alpha_prod_t ** 0.5, the
variance, std_dev_t, ...) as a float32 0-d tensor before it multiplies the float64 samples.
The vectors record exactly what diffusers computes, so an f64 implementation matches them to
about 1e-6 relative, not 1e-12. `betas_f64` / `alphas_cumprod_f64` are the same schedules
computed in float64 throughout (what an f64 implementation should reproduce tightly).

Contents (all arrays flat, row-major; `shape` gives the sample shape):
  schedules: per (beta_schedule, T): betas and alphas_cumprod as diffusers holds them.
  ddpm: DDPMScheduler(variance_type="fixed_small", clip_sample=True) steps of the full T-step
        chain (prev_t = t - 1). `mean` is the posterior mean before noise, `variance` is
        _get_variance(t) and `noise` the standard normal draw the step scaled by
        sqrt(variance) (all zeros at t = 0, where diffusers adds nothing).
  ddim: DDIMScheduler(set_alpha_to_one=True, timestep_spacing="leading", steps_offset=0)
        after set_timesteps(S), stepped with use_clipped_model_output=True and the given
        variance_noise. `prev_t` is t - T // S, or -1 when that is negative (abar_prev = 1).
"""

import argparse
import json
import math

import diffusers
import numpy as np
import torch
from diffusers import DDIMScheduler, DDPMScheduler

SHAPE = (2, 4, 2)
LINEAR = {"beta_start": 0.0001, "beta_end": 0.02}


def floats(t):
    """Flat list of Python floats (repr keeps full precision in the JSON)."""
    return [float(v) for v in torch.as_tensor(t).reshape(-1).tolist()]


def scheduler_kwargs(name, T):
    kw = {"num_train_timesteps": T, "beta_schedule": name, "clip_sample": True, "clip_sample_range": 1.0,
          "prediction_type": "epsilon"}
    if name == "linear":
        kw.update(LINEAR)
    return kw


def betas_f64(name, T):
    """The same beta schedule as diffusers, computed in float64 throughout."""
    if name == "linear":
        return torch.linspace(LINEAR["beta_start"], LINEAR["beta_end"], T, dtype=torch.float64)

    def alpha_bar(t):  # diffusers.schedulers.scheduling_ddpm.betas_for_alpha_bar, "cosine"
        return math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2

    return torch.tensor([min(1 - alpha_bar((i + 1) / T) / alpha_bar(i / T), 0.999) for i in range(T)],
                        dtype=torch.float64)


def schedule_case(name, T):
    s = DDPMScheduler(**scheduler_kwargs(name, T))
    b64 = betas_f64(name, T)
    out = {"name": name, "T": T}
    if name == "linear":
        out.update(LINEAR)
    out.update({"betas": floats(s.betas), "alphas_cumprod": floats(s.alphas_cumprod),
                "betas_f64": floats(b64), "alphas_cumprod_f64": floats(torch.cumprod(1 - b64, 0))})
    return out


def inputs(rng, eps_scale):
    sample = torch.from_numpy(rng.normal(0.0, 0.8, size=SHAPE))
    model_output = torch.from_numpy(rng.normal(0.0, 1.0, size=SHAPE)) * eps_scale
    return sample, model_output


def ddpm_case(name, T, t, rng, seed, eps_scale):
    s = DDPMScheduler(**scheduler_kwargs(name, T), variance_type="fixed_small")
    sample, model_output = inputs(rng, eps_scale)
    out = s.step(model_output, t, sample, generator=torch.Generator().manual_seed(seed))
    # randn_tensor on CPU is torch.randn(shape, generator, dtype): the same seed redraws it.
    noise = torch.randn(SHAPE, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    if t == 0:
        noise = torch.zeros(SHAPE, dtype=torch.float64)
    variance = s._get_variance(t)

    # Posterior mean, written out with diffusers' float32 coefficients.
    a_t = s.alphas_cumprod[t]
    a_prev = s.alphas_cumprod[t - 1] if t > 0 else s.one
    x0 = out.pred_original_sample
    mean = (a_prev ** 0.5 * (1 - a_t / a_prev)) / (1 - a_t) * x0 + (a_t / a_prev) ** 0.5 * (1 - a_prev) / (1 - a_t) * sample
    x0_ref = ((sample - (1 - a_t) ** 0.5 * model_output) / a_t ** 0.5).clamp(-1, 1)
    assert torch.equal(x0, x0_ref)
    err = (out.prev_sample - (mean + variance ** 0.5 * noise)).abs().max().item()
    assert err < 1e-12, (name, T, t, err)
    return {"schedule": name, "T": T, "t": t, "shape": list(SHAPE), "sample": floats(sample),
            "model_output": floats(model_output), "alpha_prod_t": float(a_t), "alpha_prod_t_prev": float(a_prev),
            "pred_original_sample": floats(x0), "mean": floats(mean), "variance": float(variance),
            "noise": floats(noise), "prev_sample": floats(out.prev_sample)}, clipped(x0)


def ddim_case(name, T, S, eta, t, rng, eps_scale):
    s = DDIMScheduler(**scheduler_kwargs(name, T), set_alpha_to_one=True, steps_offset=0,
                      timestep_spacing="leading")
    s.set_timesteps(S)
    sample, model_output = inputs(rng, eps_scale)
    noise = torch.from_numpy(rng.normal(size=SHAPE))
    out = s.step(model_output, t, sample, eta=eta, use_clipped_model_output=True, variance_noise=noise)
    prev_t = t - T // S
    a_t = s.alphas_cumprod[t]
    a_prev = s.alphas_cumprod[prev_t] if prev_t >= 0 else s.final_alpha_cumprod
    std_dev_t = eta * s._get_variance(t, prev_t) ** 0.5

    x0 = out.pred_original_sample
    x0_ref = ((sample - (1 - a_t) ** 0.5 * model_output) / a_t ** 0.5).clamp(-1, 1)
    assert torch.equal(x0, x0_ref)
    eps = (sample - a_t ** 0.5 * x0) / (1 - a_t) ** 0.5
    ref = a_prev ** 0.5 * x0 + (1 - a_prev - std_dev_t ** 2) ** 0.5 * eps + (std_dev_t * noise if eta > 0 else 0)
    err = (out.prev_sample - ref).abs().max().item()
    assert err < 1e-12, (name, T, S, eta, t, err)
    return {"schedule": name, "T": T, "S": S, "eta": eta, "timesteps": [int(v) for v in s.timesteps],
            "t": t, "prev_t": max(prev_t, -1), "shape": list(SHAPE), "sample": floats(sample),
            "model_output": floats(model_output), "noise": floats(noise), "alpha_prod_t": float(a_t),
            "alpha_prod_t_prev": float(a_prev), "pred_original_sample": floats(x0),
            "std_dev_t": float(std_dev_t), "prev_sample": floats(out.prev_sample)}, clipped(x0)


def clipped(x0):
    return int((x0.abs() == 1.0).sum())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="assets/testdata/diffusers_vectors.json")
    p.add_argument("--seed", type=int, default=20261123)
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    names = ["squaredcos_cap_v2", "linear"]

    schedules = [schedule_case(n, T) for n in names for T in (100, 20)]

    ddpm, n_clip, n_total = [], 0, 0
    for name in names:
        for T in (100, 20):
            for i, t in enumerate([T - 1, T // 2, 1, 0]):
                # One case per chain with 3x model output, so some x0 elements clip from below 1.
                case, c = ddpm_case(name, T, t, rng, seed=args.seed + len(ddpm), eps_scale=3.0 if i == 2 else 1.0)
                ddpm.append(case)
                n_clip, n_total = n_clip + c, n_total + len(case["sample"])

    ddim = []
    for name in names:
        for T, S in ((100, 10), (20, 5)):
            steps = DDIMScheduler(**scheduler_kwargs(name, T))
            steps.set_timesteps(S)
            ts = [int(v) for v in steps.timesteps]
            for eta in (0.0, 0.5, 1.0):
                for i, t in enumerate([ts[0], ts[len(ts) // 2], ts[-1]]):
                    case, c = ddim_case(name, T, S, eta, t, rng, eps_scale=3.0 if i == 1 else 1.0)
                    ddim.append(case)
                    n_clip, n_total = n_clip + c, n_total + len(case["sample"])

    data = {"generator": "tools/diffusers_vectors.py", "seed": args.seed, "diffusers": diffusers.__version__,
            "torch": torch.__version__, "schedules": schedules, "ddpm": ddpm, "ddim": ddim}
    with open(args.out, "w") as f:
        json.dump(data, f, separators=(",", ":"))
    print("wrote", args.out, {k: len(v) for k, v in data.items() if isinstance(v, list)},
          "clipped x0 elements: %d of %d" % (n_clip, n_total))


if __name__ == "__main__":
    main()
