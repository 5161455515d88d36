"""PyTorch CPU baseline for diffrl's CPU vision-language-action policy (configs/vla.toml; run via
tools/bench_vla.sh, which compares it with `diffrl bench vla`).

The network, the chain and the BC step are the ones diffrl builds from configs/vla.toml, in
float32 (the defaults below are that config's; `diffrl bench vla` prints the same fields, and
tools/bench_vla.sh refuses to compare runs whose parameter counts or settings differ):

  observation     state s [B, To * 13] (To = 1: proprioception), image [B, 3, 64, 64] in [0, 1],
                  instruction (at most 16 words)
  image encoder   x = 2 image - 1 cut into 64 patches of 8 x 8, each flattened in (channel,
  (patches.rs)    row, column) order: [B, 64, 192]
                  h = GELU(Linear(192, 64)(x) + pos[64, 64])
                  f = GELU(Linear(64, 32)(h))
                  img = Linear(64 * 32, 64)(flatten(f))
                  (--keypoints K, `kind = "patch-keypoints"`: [l, ox, oy] = Linear(32, 3K)(f),
                  w = softmax over the 64 patches of l, x_k = sum_t w_tk (cx_t + tanh(ox_tk) / 8),
                  y_k likewise with cy_t (patch centres in [-1, 1]), img = Linear(2K, 64)([x, y]))
  text encoder    word-level tokens: lowercased alphanumeric runs, <pad> = 0, <unk> = 1, then
  (tokenizer.rs,  the sorted words of the 72 training paraphrases (V = 30); every instruction
  text_encoder.rs) padded to 16 ids. The batch's U distinct instructions are encoded once:
                  h = Embedding(V, 64)(ids) + pos[16, 64]
                  h = 1 pre-norm Transformer encoder layer (d_model 64, 4 heads, feed-forward
                      256, GELU, no dropout, padding keys masked)
                  h = LayerNorm(h); txt = Linear(64, 64)(mean of h over non-padding tokens)
                  and each batch row takes its instruction's features
  condition       cond = concat[s (13), img (64), txt (64)]   (141)
  denoiser        step embedding SinusoidalPosEmb(32) -> Linear(32, 64) -> Mish -> Linear(64, 32)
  (denoiser.rs)   h = Linear(16 + 32 + 141, 256)(concat[x.flatten (Tp 4 * Da 4), t_emb, cond])
                  3 blocks h = h + Linear(256, 256)(Mish(Linear(256, 256)(h)))
                  (--film: the inner layer becomes Linear(h) * (1 + gamma) + beta with
                  [gamma, beta] = Linear(32 + 141, 512)(Mish(concat[t_emb, cond])) per block)
                  out = Linear(256, 16)(Mish(h)) reshaped to [B, 4, 4]

  policy call     what diffrl's Policy::act times: the raw observation in (state normalised to
                  [-1, 1], u8 HWC pixels to float CHW / 255, instructions tokenised), the
                  encoder once, the chain, actions and log-probs back on the host.
  chain           K = 10 DDIM steps (eta = 1) over the T = 100 squaredcos_cap_v2 schedule,
  (diffusion.rs,  leading spacing (t = 90, 80, ..., 0; abar_prev = 1 after t = 0). Per step:
  schedule.rs)    x0 = clamp((x - sqrt(1-a) out) / sqrt(a), -1, 1)   (epsilon prediction;
                       --prediction sample: x0 = clamp(out, -1, 1))
                  eps' = (x - sqrt(a) x0) / sqrt(1-a)
                  sigma = eta sqrt((1-ap)/(1-a) (1 - a/ap)),  std = max(sigma, 0.1)
                  mu = sqrt(ap) x0 + sqrt(1 - ap - sigma^2) eps'
                  x = mu + std clamp(randn, -3, 3)
                  log_prob = mean over the first Ta = 2 actions and Da of
                             clamp(log N(x; mu, std), -5, 2)
  train step      batch 64 (configs/vla.toml's [pretrain] batch_size): x_t = sqrt(abar_t) x0 +
                  sqrt(1-abar_t) noise at uniform random t, MSE(net(x_t, t, cond), noise)
                  (--prediction sample: MSE against x0), the whole encoder trained with it,
                  AdamW(lr 1e-3, weight_decay 1e-6), backward + step.

Row i of a batch tells the i-th of the 72 training paraphrases (so a batch of 64 holds 64
distinct instructions, as in `diffrl bench vla`).

Prints one JSON line per measurement:
  {"impl": "torch", "what": "chain_b1" | "chain_b64" | "train_b64", "median_ms": ..., "threads": N, ...}
"""

import argparse
import json
import math
import os
import re

import numpy as np
import torch
from torch import nn

# The schedule, the step embedding and the timing loop of the residual-MLP baseline.
from bench_policy_torch import SinusoidalPosEmb, cosine_alphas_cumprod, median_ms

STATE_DIM, ACTION_DIM = 13, 4  # lang-cubes from pixels: proprioception; dx, dy, dz, gripper
IMAGE = (3, 64, 64)  # C, H, W
STEP_EMB = 32
T_TRAIN, ETA = 100, 1.0
MIN_STD, NOISE_CLIP, LOGPROB_MIN, LOGPROB_MAX = 0.1, 3.0, -5.0, 2.0

# The lang-cubes instructions (sims/tabletop/src/language.rs): four paraphrases per family.
PICK = ["pick up the {x} cube", "lift the {x} cube", "grab the {x} cube and raise it",
        "raise the {x} cube off the table"]
STACK = ["stack the {x} cube on the {y} cube", "put the {x} cube on top of the {y} cube",
         "place the {x} cube onto the {y} cube", "set the {x} cube on the {y} cube"]
BESIDE = ["place the {x} cube to the {side} of the {y} cube", "put the {x} cube {side} of the {y} cube",
          "move the {x} cube to the {side} side of the {y} cube",
          "set the {x} cube down on the {side} of the {y} cube"]
COLORS = ["red", "green", "blue"]
HELD_OUT = [("pick", "blue", None, None), ("stack", "blue", "red", None), ("beside", "green", "blue", "left")]


def training_texts():
    """The 72 paraphrases of the 18 training instructions ([env] instructions = "train")."""
    out = []
    for x in COLORS:
        if ("pick", x, None, None) not in HELD_OUT:
            out += [t.format(x=x) for t in PICK]
        for y in COLORS:
            if y == x:
                continue
            if ("stack", x, y, None) not in HELD_OUT:
                out += [t.format(x=x, y=y) for t in STACK]
            for side in ("left", "right"):
                if ("beside", x, y, side) not in HELD_OUT:
                    out += [t.format(x=x, y=y, side=side) for t in BESIDE]
    return out


def words(text):
    return [w.lower() for w in re.split(r"[^0-9A-Za-z]+", text) if w]


class Tokenizer:
    """diffrl's word-level tokenizer: <pad> = 0, <unk> = 1, then the sorted words."""

    def __init__(self, texts, max_tokens):
        self.tokens = ["<pad>", "<unk>"] + sorted({w for t in texts for w in words(t)})
        self.index = {w: i for i, w in enumerate(self.tokens)}
        self.max_tokens = max_tokens

    def encode(self, text):
        ids = [self.index[w] for w in words(text)]  # strict: every word is known
        assert 1 <= len(ids) <= self.max_tokens, text
        return tuple(ids + [0] * (self.max_tokens - len(ids)))


def text_tokens(rows):
    """Each distinct row of ids once ([U, L] ids and padding mask) and each row's index ([B]),
    as diffrl's TextTokens::from_rows."""
    distinct, index = {}, []
    for r in rows:
        index.append(distinct.setdefault(r, len(distinct)))
    ids = torch.tensor(list(distinct), dtype=torch.long)
    return ids, ids == 0, torch.tensor(index, dtype=torch.long)


class PatchEncoder(nn.Module):
    def __init__(self, patch, hidden, token_dim, out_dim, keypoints):
        super().__init__()
        c, h, w = IMAGE
        self.patch, tokens = patch, (h // patch) * (w // patch)
        self.embed = nn.Linear(c * patch * patch, hidden)
        self.pos = nn.Parameter(torch.randn(tokens, hidden) * 0.02)
        self.mix = nn.Linear(hidden, token_dim)
        self.k = keypoints
        if keypoints:
            hp, wp = h // patch, w // patch
            self.keypoints = nn.Linear(token_dim, 3 * keypoints)
            centre = lambda i, count: (2 * i + 1) / count - 1
            self.register_buffer("cx", torch.tensor([centre(t % wp, wp) for t in range(tokens)]))
            self.register_buffer("cy", torch.tensor([centre(t // wp, hp) for t in range(tokens)]))
            self.scale = (wp, hp)
        self.head = nn.Linear(2 * keypoints if keypoints else tokens * token_dim, out_dim)

    def forward(self, images):
        n, c, h, w = images.shape
        p = self.patch
        x = (images * 2 - 1).reshape(n, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5)
        x = x.reshape(n, (h // p) * (w // p), c * p * p)
        f = nn.functional.gelu(self.mix(nn.functional.gelu(self.embed(x) + self.pos)))
        if not self.k:
            return self.head(f.flatten(1))
        # [N, T, 3K] -> [N, 3K, T]: the softmax and sums over the patches, as patches.rs.
        s = self.keypoints(f).transpose(1, 2)
        l, ox, oy = s.split(self.k, dim=1)
        weights = l.softmax(dim=-1)
        xs = (weights * (self.cx + ox.tanh() / self.scale[0])).sum(-1)
        ys = (weights * (self.cy + oy.tanh() / self.scale[1])).sum(-1)
        return self.head(torch.cat([xs, ys], dim=-1))


class TextEncoder(nn.Module):
    def __init__(self, vocab, max_tokens, d_model, heads, layers, ff_dim, out_dim):
        super().__init__()
        self.token_embedding = nn.Embedding(vocab, d_model)
        self.position_embedding = nn.Parameter(torch.randn(max_tokens, d_model) * 0.02)
        layer = nn.TransformerEncoderLayer(d_model, heads, ff_dim, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.transformer = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.final_norm = nn.LayerNorm(d_model)
        self.output = nn.Linear(d_model, out_dim)

    def forward(self, ids, pad, rows):
        h = self.token_embedding(ids) + self.position_embedding[: ids.shape[1]]
        h = self.final_norm(self.transformer(h, src_key_padding_mask=pad))
        keep = (~pad).float().unsqueeze(-1)
        pooled = (h * keep).sum(1) / keep.sum(1).clamp_min(1)
        return self.output(pooled)[rows]


class ResidualMlpDenoiser(nn.Module):
    def __init__(self, horizon, cond_dim, hidden, blocks, film):
        super().__init__()
        flat = horizon * ACTION_DIM
        self.horizon = horizon
        self.step_emb = nn.Sequential(SinusoidalPosEmb(STEP_EMB), nn.Linear(STEP_EMB, 2 * STEP_EMB), nn.Mish(),
                                      nn.Linear(2 * STEP_EMB, STEP_EMB))
        self.inp = nn.Linear(flat + STEP_EMB + cond_dim, hidden)
        self.blocks = nn.ModuleList(nn.ModuleList([nn.Linear(hidden, hidden), nn.Linear(hidden, hidden)])
                                    for _ in range(blocks))
        self.film = nn.ModuleList(nn.Linear(STEP_EMB + cond_dim, 2 * hidden) for _ in range(blocks if film else 0))
        self.act, self.out = nn.Mish(), nn.Linear(hidden, flat)

    def forward(self, x, t, cond):
        emb = self.step_emb(t)
        z = self.act(torch.cat([emb, cond], dim=-1)) if len(self.film) else None
        h = self.inp(torch.cat([x.flatten(1), emb, cond], dim=-1))
        for i, (l1, l2) in enumerate(self.blocks):
            inner = l1(h)
            if z is not None:
                gamma, beta = self.film[i](z).chunk(2, dim=-1)
                inner = inner * (1 + gamma) + beta
            h = h + l2(self.act(inner))
        return self.out(self.act(h)).view(-1, self.horizon, ACTION_DIM)


class VlaPolicy(nn.Module):
    def __init__(self, args, vocab):
        super().__init__()
        self.patches = PatchEncoder(args.patch_size, args.patch_hidden, args.token_dim, args.image_out,
                                    args.keypoints)
        self.text = TextEncoder(vocab, args.max_tokens, args.d_model, args.heads, args.layers, args.ff_dim,
                                args.text_out)
        cond = args.obs_horizon * (STATE_DIM + args.image_out) + args.text_out
        self.denoiser = ResidualMlpDenoiser(args.pred_horizon, cond, args.hidden, args.blocks, args.film)

    def condition(self, state, images, ids, pad, rows):
        """state [B, To, Ds], images [B, To, C, H, W] -> [B, cond]."""
        b, to = state.shape[:2]
        img = self.patches(images.flatten(0, 1)).view(b, -1)
        return torch.cat([state.flatten(1), img, self.text(ids, pad, rows)], dim=-1)


class Chain:
    """The K-step eta = 1 DDIM chain of diffrl's DiffusionProcess::sample (stochastic mode)."""

    def __init__(self, args, abar):
        self.k, self.ta, self.sample = args.denoising_steps, args.action_horizon, args.prediction == "sample"
        step = T_TRAIN // self.k
        self.steps = []
        for t in range(T_TRAIN - step, -1, -step):
            a, ap = abar[t], (abar[t - step] if t - step >= 0 else 1.0)
            sigma = ETA * math.sqrt(max((1 - ap) / (1 - a) * (1 - a / ap), 0.0))
            d = math.sqrt(max(1 - ap - sigma ** 2, 0.0))
            c_x0, c_xt = math.sqrt(ap) - d * math.sqrt(a) / math.sqrt(1 - a), d / math.sqrt(1 - a)
            self.steps.append((t, math.sqrt(a), math.sqrt(1 - a), c_x0, c_xt, sigma))

    def __call__(self, net, cond, horizon):
        b = cond.shape[0]
        x = torch.randn(b, horizon, ACTION_DIM)
        log_probs = []
        for t, sa, s1a, c_x0, c_xt, sigma in self.steps:
            out = net.denoiser(x, torch.full((b,), float(t)), cond)
            x0 = (out if self.sample else (x - s1a * out) / sa).clamp(-1, 1)
            mu = c_x0 * x0 + c_xt * x
            std = max(sigma, MIN_STD)
            x = mu + std * torch.randn_like(mu).clamp(-NOISE_CLIP, NOISE_CLIP)
            lp = -((x - mu) ** 2) / (2 * std ** 2) - math.log(std) - 0.5 * math.log(2 * math.pi)
            log_probs.append(lp.clamp(LOGPROB_MIN, LOGPROB_MAX)[:, : self.ta].mean(dim=(1, 2)))
        return x, torch.stack(log_probs)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=100, help="timed repeats per measurement (train: a quarter)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batches", default="1,64", help="chain batch sizes, comma-separated")
    # configs/vla.toml's settings (its own, and the PolicyConfig / BcConfig defaults it keeps).
    p.add_argument("--obs-horizon", type=int, default=1)
    p.add_argument("--pred-horizon", type=int, default=4)
    p.add_argument("--action-horizon", type=int, default=2)
    p.add_argument("--patch-size", type=int, default=8)
    p.add_argument("--patch-hidden", type=int, default=64)
    p.add_argument("--token-dim", type=int, default=32)
    p.add_argument("--image-out", type=int, default=64)
    p.add_argument("--keypoints", type=int, default=0,
                   help="the keypoint read-out's K (kind = \"patch-keypoints\"); 0: the linear read-out")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--ff-dim", type=int, default=256)
    p.add_argument("--text-out", type=int, default=64)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--film", action="store_true")
    p.add_argument("--prediction", choices=["epsilon", "sample"], default="epsilon")
    p.add_argument("--denoising-steps", type=int, default=10)
    p.add_argument("--train-batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=1e-6)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    texts = training_texts()
    tok = Tokenizer(texts, args.max_tokens)
    net = VlaPolicy(args, len(tok.tokens))
    chain = Chain(args, cosine_alphas_cumprod(T_TRAIN))
    to, tp = args.obs_horizon, args.pred_horizon
    # The load average and OpenMP wait policy are recorded because a busy machine distorts
    # multi-threaded numbers (tools/bench_policy_torch.py).
    common = {"params": sum(p.numel() for p in net.parameters()), "torch": torch.__version__,
              "denoising_steps": args.denoising_steps, "prediction": args.prediction, "film": args.film,
              "vocab": len(tok.tokens), "instructions": len(texts),
              "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default")}

    def emit(what, repeats, med, best):
        print(json.dumps({"impl": "torch", "what": what, "median_ms": med, "threads": args.threads, "min_ms": best,
                          "repeats": repeats, "load1": os.getloadavg()[0], **common}), flush=True)

    net.eval()  # no dropout anywhere: only lets PyTorch take its inference fast paths
    lo, hi = -1.0, 1.0  # diffrl bench vla's normalisers leave [-1, 1] as it is

    def act(state, pixels, instructions):
        """One policy call: raw state [B, To, Ds], u8 pixels [B, To, H, W, C], strings."""
        s = (torch.from_numpy(state) - lo) / (hi - lo) * 2 - 1
        images = torch.from_numpy(pixels).permute(0, 1, 4, 2, 3).float() / 255
        cond = net.condition(s, images, *text_tokens([tok.encode(t) for t in instructions]))
        x, lp = chain(net, cond, tp)
        return ((x + 1) / 2 * (hi - lo) + lo).numpy(), lp.numpy()

    with torch.inference_mode():
        for batch in (int(b) for b in args.batches.split(",")):
            c, h, w = IMAGE
            state = rng.uniform(lo, hi, (batch, to, STATE_DIM)).astype(np.float32)
            pixels = rng.integers(0, 256, (batch, to, h, w, c), dtype=np.uint8)
            instructions = [texts[i % len(texts)] for i in range(batch)]
            x, lp = act(state, pixels, instructions)
            assert x.shape == (batch, tp, ACTION_DIM) and lp.shape == (args.denoising_steps, batch)
            assert np.isfinite(lp).all()
            emit(f"chain_b{batch}", args.repeats,
                 *median_ms(lambda: act(state, pixels, instructions), args.repeats,
                            warmup=max(5, args.repeats // 10)))

    net.train()
    batch = args.train_batch
    opt = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    state = torch.rand(batch, to, STATE_DIM) * 2 - 1
    images = torch.rand(batch, to, *IMAGE)
    rows = [tok.encode(texts[i % len(texts)]) for i in range(batch)]
    actions = torch.rand(batch, tp, ACTION_DIM) * 2 - 1
    abar_t = torch.tensor(cosine_alphas_cumprod(T_TRAIN), dtype=torch.float32)

    def train_step():
        t = torch.randint(0, T_TRAIN, (batch,))
        noise = torch.randn_like(actions)
        a = abar_t[t].view(-1, 1, 1)
        x_t = a.sqrt() * actions + (1 - a).sqrt() * noise
        cond = net.condition(state, images, *text_tokens(rows))
        target = actions if args.prediction == "sample" else noise
        loss = nn.functional.mse_loss(net.denoiser(x_t, t.float(), cond), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.item()

    repeats = max(1, args.repeats // 4)
    emit(f"train_b{batch}", repeats, *median_ms(train_step, repeats, warmup=max(3, repeats // 10)))


if __name__ == "__main__":
    main()
