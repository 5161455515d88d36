#!/usr/bin/env python3
"""The projection of docs/scale.md ("What 8 GPUs x N machines would give"): data-parallel GRPO
and BC over W workers (one GPU each), from the measured inputs below, under two all-reduce
models. It prints markdown tables; change an input with its flag to project other figures.

Model (weak scaling: every worker keeps one GPU's work per iteration, so the global batch grows
W-fold, which is what GRPO wants from more GPUs; splitting a fixed minibatch over GPUs gains
nothing, since the update step is launch-bound below ~1,000 rows, docs/scale.md):

    T(W) = T_collect + U * (t_step + t_allreduce(W))        seconds per iteration
    t_allreduce(W) = 2 (W - 1) / W * S / B + 2 (W - 1) * alpha   (ring all-reduce)

S = 4 bytes x parameters (f32 gradients); B, alpha per link model. Efficiency = T(1) / T(W);
throughput = W x (rollouts per worker) / T(W).
"""

import argparse

# Measured inputs (docs/scale.md, docs/grpo.md, docs/vla.md; 2026-11-25/26).
PUSHT_PARAMS = 416_104  # the default Push-T policy (pretrain log line)
PUSHT_8X_PARAMS = 3_230_000  # hidden 724 (tools/bench_gpu.sh)
VLA_GPU_PARAMS = 107_617_648  # configs/vla-gpu.toml
STEP_MS = {"pusht": 5.67, "pusht-8x": 7.93}  # GRPO update, 2,048 pairs, H200
VLA_GPU_STEP_MS = 240.0  # BC step, batch 256, H200
# One Push-T PPO/GRPO iteration of the embedded config on the 2 cores (64 rollouts, 14,683
# env steps, 36.7k pairs per epoch, 4 epochs of 2,048-pair minibatches = 72 update steps;
# collection 1.68 s with the chains on the CPU: runs/<run>/grpo/metrics.jsonl).
COLLECT_S = 1.68
UPDATE_STEPS = 72
ROLLOUTS = 64
# burn-collective 0.21 on loopback websockets, the one-line upstream fix applied: 301
# all-reduces of 1.66 MB in 1.8-1.9 s (docs/scale.md), about 6.1 ms each.
BC_MEASURED_MS, BC_MEASURED_BYTES = 6.1, 1.66e6


def ring(w, s_bytes, bw, alpha):
    if w == 1:
        return 0.0
    return 2 * (w - 1) / w * s_bytes / bw + 2 * (w - 1) * alpha


def links(a):
    """t_allreduce(W, S) in seconds for each link model."""

    def burn(w, s):
        # Bandwidth-bound at the measured effective rate; latency growth with W not modelled
        # (optimistic: each sync opens fresh connections to every peer).
        if w == 1:
            return 0.0
        return BC_MEASURED_MS / 1e3 * (s / BC_MEASURED_BYTES) * (2 * (w - 1) / w)

    def nccl(w, s):
        bw = a.intra_gbs if w <= a.gpus_per_node else a.inter_gbs
        return ring(w, s, bw * 1e9, a.alpha_us * 1e-6)

    return {"burn-collective 0.21 (measured rate)": burn, "NCCL-class links (assumed)": nccl}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", default="1,2,8,16,64")
    p.add_argument("--collect-s", type=float, default=COLLECT_S)
    p.add_argument("--intra-gbs", type=float, default=300.0,
                   help="all-reduce bus bandwidth inside a node, GB/s (assumed: NVLink 4)")
    p.add_argument("--inter-gbs", type=float, default=40.0,
                   help="per-GPU bandwidth across nodes, GB/s (assumed: 400 Gb/s NIC per GPU)")
    p.add_argument("--alpha-us", type=float, default=5.0, help="per-hop latency, microseconds")
    p.add_argument("--gpus-per-node", type=int, default=8)
    a = p.parse_args()
    ws = [int(w) for w in a.workers.split(",")]
    ls = links(a)

    print("Communication per update step (f32 gradients, ring all-reduce sends 2(W-1)/W of it):\n")
    print("| model | parameters | gradient bytes | update step on one H200 |")
    print("|---|---|---|---|")
    for name, n, ms in [("Push-T default", PUSHT_PARAMS, STEP_MS["pusht"]),
                        ("Push-T 8x", PUSHT_8X_PARAMS, STEP_MS["pusht-8x"]),
                        ("VLA GPU config (BC)", VLA_GPU_PARAMS, VLA_GPU_STEP_MS)]:
        print(f"| {name} | {n:,} | {4 * n / 1e6:.1f} MB | {ms:g} ms |")

    print("\nGRPO on Push-T, weak scaling (each worker: 64 rollouts, 72 update steps per iteration);")
    print("each cell: rollouts/s; efficiency T(1)/T(W); all-reduce's share of an update step:\n")
    hdr = "| model | link | " + " | ".join(f"W = {w}" for w in ws) + " |"
    print(hdr)
    print("|---|---|" + "---|" * len(ws))
    for model, n in [("pusht", PUSHT_PARAMS), ("pusht-8x", PUSHT_8X_PARAMS)]:
        step = STEP_MS[model] / 1e3
        t1 = a.collect_s + UPDATE_STEPS * step
        for lname, f in ls.items():
            cells = []
            for w in ws:
                ar = f(w, 4 * n)
                tw = a.collect_s + UPDATE_STEPS * (step + ar)
                cells.append(f"{w * ROLLOUTS / tw:,.0f}; {t1 / tw:.2f}; {ar / (step + ar):.0%}")
            print(f"| {model} | {lname} | " + " | ".join(cells) + " |")

    print("\nBC of the VLA GPU config (batch 256 per worker); each cell: samples/s; efficiency:\n")
    print(hdr)
    print("|---|---|" + "---|" * len(ws))
    step = VLA_GPU_STEP_MS / 1e3
    for lname, f in ls.items():
        cells = []
        for w in ws:
            ar = f(w, 4 * VLA_GPU_PARAMS)
            cells.append(f"{w * 256 / (step + ar):,.0f}; {step / (step + ar):.2f}")
        print(f"| VLA GPU | {lname} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
