//! `diffrl bench TASK`: environment steps per second on one thread, for side-by-side
//! comparison with gym-pusht (tools/bench_pusht.sh runs both with the same workloads).
//! `diffrl bench policy` and `diffrl bench vla` time a policy's chain and BC step for the same
//! comparison with PyTorch (tools/bench_policy.sh, tools/bench_vla.sh).

use std::io::Write;
use std::time::Instant;

use anyhow::Context;
use clap::{Args, ValueEnum};
use diffrl_core::Env;
use diffrl_core::seeding;
use diffrl_learn::adamw::Adam;
use rand::Rng;

/// Which actions drive the benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Workload {
    /// Uniform random actions in the action space (Push-T: targets in [0, 512]^2, gym's random
    /// policy; little contact).
    Random,
    /// The task's scripted workload (Push-T: targets at the block position plus uniform noise
    /// of +-20 px, constant pushing).
    Push,
}

/// Arguments of `diffrl bench TASK`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// A task (`pusht`: its default [env] settings), `policy`, `vla` or `serve`.
    pub task: String,
    /// Observation mode: sets [env].obs (Push-T: state, keypoints or pixels; default: the
    /// task's default, keypoints for Push-T).
    #[arg(long)]
    pub obs: Option<String>,
    /// A key of the task's [env] table, as KEY=VALUE with a TOML value (a bare word is a
    /// string), e.g. `--env arm_joints=impulse`; repeatable.
    #[arg(long = "env", value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// Action workload.
    #[arg(long, value_enum, default_value_t = Workload::Random)]
    pub workload: Workload,
    /// Environment steps to time.
    #[arg(long, default_value_t = 20_000)]
    pub steps: usize,
    /// Seed of resets and actions.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// `policy` and `vla`: timed repetitions per measurement (the median is reported; BC
    /// steps: at most 30).
    #[arg(long, default_value_t = 50)]
    pub repeats: usize,
    /// `policy` only: residual-MLP width.
    #[arg(long, default_value_t = 256)]
    pub hidden: usize,
    /// `policy` only: residual blocks.
    #[arg(long, default_value_t = 3)]
    pub blocks: usize,
    /// `policy` only: nonlinearity (mish, silu, relu).
    #[arg(long, default_value = "mish")]
    pub activation: String,
    /// `policy` and `vla`: where the model runs.
    #[arg(long, value_enum, default_value_t = crate::device::DeviceArg::Cpu)]
    pub device: crate::device::DeviceArg,
    /// `serve` only: the checkpoint to serve.
    #[arg(long)]
    pub policy: Option<std::path::PathBuf>,
    /// `policy` and `vla`: the chain batch sizes to time (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 64])]
    pub batches: Vec<usize>,
    /// `policy` only: (environment step, denoising step) pairs per timed GRPO minibatch update
    /// (`[grpo] minibatch`'s default).
    #[arg(long, default_value_t = 2048)]
    pub pairs: usize,
    /// `vla` only: the run config whose policy is timed (default: configs/vla.toml, embedded).
    #[arg(long)]
    pub config: Option<std::path::PathBuf>,
    /// `serve` only: concurrent clients.
    #[arg(long, default_value_t = 32)]
    pub clients: usize,
    /// `serve` only: requests per client.
    #[arg(long, default_value_t = 200)]
    pub requests: usize,
}

/// Runs the benchmark and prints one JSON line.
pub fn run(args: &BenchArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    if args.task == "policy" {
        return with_device!(args.device, |device, B| policy::<B>(args, &device, out));
    }
    if args.task == "vla" {
        return with_device!(args.device, |device, B| vla::<B>(args, &device, out));
    }
    if args.task == "serve" {
        let policy = args
            .policy
            .as_deref()
            .context("`diffrl bench serve` needs --policy DIR (the checkpoint to serve)")?;
        let load = crate::commands::serve::LoadArgs {
            policy,
            clients: args.clients,
            requests: args.requests,
            repeats: args.repeats.max(100),
            seed: args.seed,
        };
        return crate::commands::serve::bench_serve(&load, out);
    }
    let task = crate::tasks::get(&args.task).map_err(|_| {
        anyhow::anyhow!(
            "unknown benchmark {:?}; available: {}, policy, vla, serve",
            args.task,
            crate::tasks::names().join(", ")
        )
    })?;
    anyhow::ensure!(args.steps >= 1, "--steps must be at least 1");
    let mut env_cfg = task.default_env();
    if let Some(obs) = &args.obs {
        let mut patch = toml::Table::new();
        patch.insert("obs".into(), toml::Value::String(obs.clone()));
        env_cfg = env_cfg
            .patched(&patch)
            .map_err(|i| anyhow::anyhow!("--obs {obs}: {}", i.message))?;
    }
    for setting in &args.env {
        let (key, value) = env_setting(setting)?;
        let mut patch = toml::Table::new();
        patch.insert(key.clone(), value);
        env_cfg = env_cfg
            .patched(&patch)
            .map_err(|i| anyhow::anyhow!("--env {setting}: {}", i.message))?;
    }
    let mut env = env_cfg.build();
    let space = env.action_space();
    let mut rng = seeding::rng(args.seed);
    let mut episode = 0;
    env.reset(seeding::derive(args.seed, episode));
    let (mut successes, mut resets) = (0usize, 0usize);
    let start = Instant::now();
    for _ in 0..args.steps {
        let a: Vec<f32> = match args.workload {
            Workload::Random => space
                .low
                .iter()
                .zip(&space.high)
                .map(|(&lo, &hi)| rng.random_range(lo..hi))
                .collect(),
            Workload::Push => task
                .scripted_action(&env, &mut rng)
                .with_context(|| format!("task {} has no scripted (push) workload", task.name()))?,
        };
        let r = env.step(&a)?;
        if r.terminated || r.truncated {
            successes += r.terminated as usize;
            resets += 1;
            episode += 1;
            env.reset(seeding::derive(args.seed, episode));
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let obs = env_cfg.observation();
    let workload = format!("{:?}", args.workload).to_lowercase();
    writeln!(
        out,
        "{}",
        serde_json::json!({"impl": "diffrl", "obs": obs, "workload": workload, "env": args.env, "steps": args.steps, "seconds": secs,
                           "steps_per_s": args.steps as f64 / secs, "resets": resets, "successes": successes})
    )?;
    Ok(())
}

/// `KEY=VALUE` of `--env`: the value parsed as TOML, else taken as a string.
fn env_setting(setting: &str) -> anyhow::Result<(String, toml::Value)> {
    let (key, raw) = setting
        .split_once('=')
        .with_context(|| format!("--env {setting:?}: expected KEY=VALUE"))?;
    let key = key.trim();
    anyhow::ensure!(!key.is_empty(), "--env {setting:?}: the key is empty");
    let raw = raw.trim();
    let value = format!("v = {raw}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_string()));
    Ok((key.to_string(), value))
}

/// Median of `v` seconds in milliseconds (the upper middle value of an even count).
fn median_ms(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    diffrl_core::stats::nearest_rank_quantile(&v, 0.5).unwrap_or(f64::NAN) * 1e3
}

/// Writes the JSON lines of `bench policy` and `bench vla` (the format of
/// tools/bench_policy_torch.py and tools/bench_vla_torch.py): the fields every line shares,
/// and each measurement's own.
struct Lines<'a> {
    out: &'a mut dyn Write,
    common: serde_json::Map<String, serde_json::Value>,
    /// Whether each line records the 1-minute load average (`load1`).
    load: bool,
}

impl<'a> Lines<'a> {
    /// Lines to `out` that all carry the fields of the JSON object `common`.
    fn new(out: &'a mut dyn Write, common: serde_json::Value) -> Self {
        let common = match common {
            serde_json::Value::Object(map) => map,
            _ => serde_json::Map::new(),
        };
        Self {
            out,
            common,
            load: false,
        }
    }

    /// The same lines with the 1-minute load average at each measurement, as PyTorch's lines
    /// have it (`bench vla`; `bench policy`'s lines keep the fields tools/bench_policy.sh
    /// reads).
    fn with_load_average(mut self) -> Self {
        self.load = true;
        self
    }

    /// One measurement named `what` (`chain_b1`, `train_b64`, ...); `fields` add to or replace
    /// the shared ones.
    fn emit(
        &mut self,
        what: &str,
        median_ms: f64,
        fields: serde_json::Value,
    ) -> anyhow::Result<()> {
        let mut line = self.common.clone();
        line.insert("what".into(), what.into());
        line.insert("median_ms".into(), median_ms.into());
        if self.load {
            line.insert("load1".into(), load_average().into());
        }
        if let serde_json::Value::Object(f) = fields {
            line.extend(f);
        }
        writeln!(self.out, "{}", serde_json::Value::Object(line))?;
        Ok(())
    }
}

/// The 1-minute load average (Linux), recorded with each measurement because other work on
/// the cores distorts it; None where /proc/loadavg cannot be read.
fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Observations of a synthetic chain batch for `policy`: `state` values drawn uniformly from
/// `state_range` (raw units), uniform random pixels when it sees images, and row i telling
/// `texts[i % texts.len()]` when it reads text.
fn random_obs<B: burn::tensor::backend::Backend>(
    policy: &diffrl_policy::Policy<B>,
    batch: usize,
    state_range: std::ops::Range<f32>,
    texts: &[String],
    rng: &mut seeding::Rng,
) -> diffrl_policy::ObsBatch {
    let to = policy.config.obs_horizon;
    let state = (0..batch * to * policy.spec.state_dim)
        .map(|_| rng.random_range(state_range.clone()))
        .collect();
    let image = policy.spec.image.map(|[c, h, w]| {
        (0..batch * to * c * h * w)
            .map(|_| rng.random::<u8>())
            .collect()
    });
    let text = policy
        .spec
        .text
        .then(|| (0..batch).map(|i| texts[i % texts.len()].clone()).collect());
    diffrl_policy::ObsBatch {
        batch,
        state,
        image,
        text,
    }
}

/// Times `repeats` stochastic chains of `policy` (log-probs recorded, as rollouts do; raw
/// observation in, actions read back) at each of `batches`, after 5 untimed ones; one line
/// `chain_b{B}` per batch size.
fn time_chains<B: burn::tensor::backend::Backend>(
    policy: &diffrl_policy::Policy<B>,
    batches: &[usize],
    repeats: usize,
    mut obs: impl FnMut(usize, &mut seeding::Rng) -> diffrl_policy::ObsBatch,
    rng: &mut seeding::Rng,
    device: &B::Device,
    lines: &mut Lines<'_>,
) -> anyhow::Result<()> {
    anyhow::ensure!(repeats >= 1, "--repeats must be at least 1");
    anyhow::ensure!(
        batches.iter().all(|&b| b >= 1),
        "--batches: every batch size must be at least 1"
    );
    for &b in batches {
        let obs = obs(b, rng);
        let mut times = Vec::new();
        for i in 0..repeats + 5 {
            let t = Instant::now();
            let act = policy.act(
                None,
                &obs,
                diffrl_policy::SampleMode::Stochastic,
                true,
                rng,
                device,
            )?;
            let _ = act.sample.logp.map(|l| l.into_data());
            if i >= 5 {
                times.push(t.elapsed().as_secs_f64());
            }
        }
        lines.emit(
            &format!("chain_b{b}"),
            median_ms(times),
            serde_json::json!({}),
        )?;
    }
    Ok(())
}

/// One behaviour-cloning batch on the host, normalised, in the layouts `diffrl pretrain`
/// gathers from its dataset (crates/learn/src/bc.rs).
struct BcBatch {
    /// [B, To, Ds].
    state: Vec<f32>,
    /// [B, To, C, H, W] in [0, 1], when the policy sees images.
    image: Option<Vec<f32>>,
    /// One instruction per row, when the policy reads text.
    text: Option<Vec<diffrl_policy::tokenizer::Tokens>>,
    /// [B, Tp, Da].
    actions: Vec<f32>,
}

impl BcBatch {
    /// Uniform random states and actions in [-1, 1] and pixels in [0, 1] for `policy`; row i
    /// tells `texts[i % texts.len()]` when it reads text.
    fn random<B: burn::tensor::backend::Backend>(
        policy: &diffrl_policy::Policy<B>,
        batch: usize,
        texts: &[diffrl_policy::tokenizer::Tokens],
        rng: &mut seeding::Rng,
    ) -> Self {
        let to = policy.config.obs_horizon;
        let mut uniform = |n: usize, lo: f32, hi: f32| -> Vec<f32> {
            (0..n).map(|_| rng.random_range(lo..hi)).collect()
        };
        let state = uniform(batch * to * policy.spec.state_dim, -1.0, 1.0);
        let image = policy
            .spec
            .image
            .map(|[c, h, w]| uniform(batch * to * c * h * w, 0.0, 1.0));
        let [tp, da] = policy.chunk();
        let actions = uniform(batch * tp * da, -1.0, 1.0);
        let text = policy
            .spec
            .text
            .then(|| (0..batch).map(|i| texts[i % texts.len()].clone()).collect());
        Self {
            state,
            image,
            text,
            actions,
        }
    }

    /// Rows `rows` uploaded as `policy`'s observation tensors and action chunks.
    fn tensors<B: burn::tensor::backend::Backend>(
        &self,
        policy: &diffrl_policy::Policy<B>,
        rows: std::ops::Range<usize>,
        device: &B::Device,
    ) -> (
        diffrl_policy::encoder::ObsTensors<B>,
        burn::tensor::Tensor<B, 3>,
    ) {
        use burn::tensor::{Tensor, TensorData};
        let n = rows.len();
        let (to, ds) = (policy.config.obs_horizon, policy.spec.state_dim);
        let [tp, da] = policy.chunk();
        let slice = |v: &[f32], per: usize| v[rows.start * per..rows.end * per].to_vec();
        let obs = diffrl_policy::encoder::ObsTensors {
            state: Tensor::from_data(
                TensorData::new(slice(&self.state, to * ds), [n, to, ds]),
                device,
            ),
            image: self
                .image
                .as_ref()
                .zip(policy.spec.image)
                .map(|(px, [c, h, w])| {
                    Tensor::from_data(
                        TensorData::new(slice(px, to * c * h * w), [n, to, c, h, w]),
                        device,
                    )
                }),
            text: self.text.as_ref().map(|t| {
                diffrl_policy::text_encoder::TextTokens::from_rows(&t[rows.clone()], device)
            }),
        };
        let actions = Tensor::from_data(
            TensorData::new(slice(&self.actions, tp * da), [n, tp, da]),
            device,
        );
        (obs, actions)
    }
}

/// Median milliseconds of one BC step of `train` (its loss over a fresh random batch of
/// `batch` rows cut into `shards` shards, backward, one step of `optim` at `lr`), over
/// `repeats` steps after 3 untimed ones.
#[allow(clippy::too_many_arguments)]
fn time_bc_steps<B>(
    train: &mut diffrl_policy::Policy<B>,
    optim: &mut Adam<B, diffrl_policy::PolicyModel<B>>,
    lr: f64,
    batch: usize,
    shards: usize,
    repeats: usize,
    mut draw: impl FnMut(&diffrl_policy::Policy<B>, &mut seeding::Rng) -> BcBatch,
    rng: &mut seeding::Rng,
    device: &B::Device,
) -> anyhow::Result<f64>
where
    B: burn::tensor::backend::AutodiffBackend,
{
    let mut times = Vec::new();
    for i in 0..repeats + 3 {
        let data = draw(train, rng);
        let step_seed = rng.random::<u64>();
        let t = Instant::now();
        let (grads, _) = diffrl_learn::parallel::sharded_grads(
            &train.model,
            batch,
            shards,
            |k, rows, model| {
                let policy = train.with_model(model.clone());
                let (obs, actions) = data.tensors(&policy, rows, device);
                let mut r = seeding::rng(seeding::derive(step_seed, k as u64));
                Ok(policy.bc_loss(&obs, actions, &mut r))
            },
        )?;
        train.model = optim.step(lr, train.model.clone(), grads, None, None)?;
        B::sync(device).map_err(|e| anyhow::anyhow!("device sync: {e:?}"))?;
        if i >= 3 {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    Ok(median_ms(times))
}

/// `diffrl bench policy`: one K = 10 chain at each of `--batches`, one BC training step at batch
/// 256 and one GRPO minibatch update over `--pairs` (environment step, denoising step) pairs, of
/// the default residual-MLP diffusion policy at Diffusion Policy's horizons (To 2, Tp 16, Ta 8;
/// Push-T state dimensions); JSON lines in the format of tools/bench_policy_torch.py.
fn policy<B: burn::tensor::backend::AutodiffBackend>(
    args: &BenchArgs,
    device: &B::Device,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    use burn::tensor::{Tensor, TensorData};
    use diffrl_core::normalize::Normalizer;
    use diffrl_policy::encoder::ObsTensors;
    use diffrl_policy::{Normalizers, Policy, PolicyConfig, PolicySpec};

    let mut cfg = PolicyConfig {
        obs_horizon: 2,
        pred_horizon: 16,
        action_horizon: 8,
        ..PolicyConfig::default()
    };
    cfg.denoiser.hidden = args.hidden;
    cfg.denoiser.blocks = args.blocks;
    cfg.denoiser.activation = serde_json::from_value(serde_json::json!(args.activation))
        .map_err(|_| anyhow::anyhow!("--activation: expected mish, silu or relu"))?;
    let spec = PolicySpec::flat(5, 2);
    let norm = Normalizers {
        state: Normalizer::MinMax {
            min: vec![0.0; 5],
            max: vec![512.0; 5],
        },
        action: Normalizer::MinMax {
            min: vec![0.0; 2],
            max: vec![512.0; 2],
        },
    };
    let policy =
        Policy::<B::InnerBackend>::new(cfg.clone(), spec.clone(), norm.clone(), args.seed, device)?;
    let mut rng = seeding::rng(args.seed);
    let threads = rayon::current_num_threads();
    anyhow::ensure!(args.pairs >= 1, "--pairs must be at least 1");
    let params = burn::module::Module::num_params(&policy.model);
    let backend = format!("{:?}", args.device).to_lowercase();
    let mut lines = Lines::new(
        out,
        serde_json::json!({"impl": "diffrl", "device": backend, "threads": threads, "params": params}),
    );
    time_chains(
        &policy,
        &args.batches,
        args.repeats,
        |b, rng| random_obs(&policy, b, 0.0..512.0, &[], rng),
        &mut rng,
        device,
        &mut lines,
    )?;
    let mut train = Policy::<B>::new(cfg, spec, norm, args.seed, device)?;
    let b = 256;
    // One BC step; then the same step with the batch cut into shards on as many threads
    // ([pretrain].threads), AdamW's pass on as many (crates/learn/src/adamw.rs).
    for shards in [1usize, 2, 4].into_iter().filter(|&s| s <= threads.max(2)) {
        let mut optim = Adam::new(1e-4, shards, device);
        let ms = time_bc_steps(
            &mut train,
            &mut optim,
            1e-4,
            b,
            shards,
            args.repeats.min(30),
            |p, rng| BcBatch::random(p, b, &[], rng),
            &mut rng,
            device,
        )?;
        let (what, threads) = match shards {
            1 => (format!("train_b{b}"), threads),
            s => (format!("train_b{b}_shards{s}"), s),
        };
        lines.emit(&what, ms, serde_json::json!({"threads": threads}))?;
    }
    // One GRPO minibatch update (crates/learn/src/surrogate.rs): the log-probs of `pairs`
    // stored (x_k, x_{k-1}) pairs at mixed chain steps under the current weights, the clipped
    // surrogate, its backward pass and an AdamW step.
    let n = args.pairs;
    let k = train.process().map_or(1, |p| p.ft_steps());
    let mut optim = Adam::new(1e-4, 1, device);
    let mut times = Vec::new();
    for i in 0..args.repeats.min(30) + 3 {
        let rand = |len: usize, rng: &mut diffrl_core::seeding::Rng| -> Vec<f32> {
            (0..len).map(|_| rng.random_range(-1.0..1.0)).collect()
        };
        let obs = ObsTensors {
            state: Tensor::from_data(TensorData::new(rand(n * 10, &mut rng), [n, 2, 5]), device),
            image: None,
            text: None,
        };
        let x = Tensor::from_data(TensorData::new(rand(n * 32, &mut rng), [n, 16, 2]), device);
        let next = Tensor::from_data(TensorData::new(rand(n * 32, &mut rng), [n, 16, 2]), device);
        let old = Tensor::from_data(TensorData::new(rand(n, &mut rng), [n]), device);
        let adv = Tensor::from_data(TensorData::new(rand(n, &mut rng), [n]), device);
        let steps: Vec<usize> = (0..n).map(|j| j % k).collect();
        let t = Instant::now();
        let new = train.pair_logprobs(&obs, x, next, &steps);
        let loss = diffrl_learn::grpo::surrogate_loss(new, old, adv, None, [0.2, 0.2], 0.0);
        let grads = burn::optim::GradientsParams::from_grads(loss.backward(), &train.model);
        train.model = optim.step(1e-4, train.model.clone(), grads, None, None)?;
        B::sync(device).map_err(|e| anyhow::anyhow!("device sync: {e:?}"))?;
        if i >= 3 {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    let ms = median_ms(times);
    lines.emit(
        &format!("update_pairs{n}"),
        ms,
        serde_json::json!({"pairs_per_s": n as f64 / (ms / 1e3)}),
    )
}

/// The default config of `diffrl bench vla`: the CPU vision-language-action config.
const VLA_CONFIG: (&str, &str) = (
    "configs/vla.toml",
    include_str!("../../../../configs/vla.toml"),
);

/// `diffrl bench vla`: the policy of a run config (default: configs/vla.toml) built as
/// `diffrl pretrain` builds it, freshly initialised, timed like `bench policy`: one chain of
/// the config's sampler at each of `--batches` and one BC step at `[pretrain] batch_size`,
/// whole and in `[pretrain] threads` shards. Inputs are random states and pixels of the
/// configured shapes; the instructions are those of the first `[demos] episodes` resets (the
/// episodes `diffrl demos --seed [run].seed` records), whose words make the vocabulary, and
/// row i of a batch tells the i-th distinct one. JSON lines in the format of
/// tools/bench_vla_torch.py.
fn vla<B: burn::tensor::backend::AutodiffBackend>(
    args: &BenchArgs,
    device: &B::Device,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    use diffrl_core::normalize::Normalizer;
    use diffrl_policy::{Normalizers, Policy, Strictness, Vocabulary};

    let (cfg, origin) = match &args.config {
        Some(path) => (
            crate::config::load(Some(path))?.0,
            path.display().to_string(),
        ),
        None => {
            let (origin, text) = VLA_CONFIG;
            let path = diffrl_core::config::embedded(origin);
            (crate::config::parse(text, &path)?, origin.to_string())
        }
    };
    let spec = crate::envs::env_spec(&cfg)?;
    let mut texts: Vec<String> = Vec::new();
    if spec.text {
        let mut env = cfg.env.build();
        for i in 0..cfg.demos.episodes {
            let obs = env.reset(seeding::derive(cfg.run.seed, i as u64));
            let text = obs.text.with_context(|| {
                format!("{origin}: an observation of task {} has no text", cfg.task)
            })?;
            if !texts.contains(&text) {
                texts.push(text);
            }
        }
        anyhow::ensure!(
            !texts.is_empty(),
            "{origin}: [demos] episodes = 0 draws no instructions"
        );
    }
    // Normalisers that leave [-1, 1] as it is: the random inputs are drawn there.
    let unit = |dim: usize| Normalizer::MinMax {
        min: vec![-1.0; dim],
        max: vec![1.0; dim],
    };
    let norm = Normalizers {
        state: unit(spec.state_dim),
        action: unit(spec.action_dim),
    };
    let seed = cfg.run.seed;
    let mut train = if spec.text {
        let vocab = Vocabulary::from_texts(texts.iter().map(String::as_str));
        Policy::<B>::with_text(cfg.policy.clone(), spec, norm, vocab, seed, device)?
    } else {
        Policy::<B>::new(cfg.policy.clone(), spec, norm, seed, device)?
    };
    let policy = train.valid();
    let tokens = match policy.tokenizer() {
        Some(_) => policy.tokenize(&texts, Strictness::Strict)?,
        None => Vec::new(),
    };
    let threads = rayon::current_num_threads();
    let params = burn::module::Module::num_params(&policy.model);
    let backend = format!("{:?}", args.device).to_lowercase();
    let diffusion = &cfg.policy.diffusion;
    let mut lines = Lines::new(
        out,
        serde_json::json!({
            "impl": "diffrl", "device": backend, "threads": threads, "params": params,
            "config": origin, "denoising_steps": diffusion.denoising_steps,
            "prediction": diffusion.prediction, "film": cfg.policy.denoiser.film,
            "vocab": policy.tokenizer().map_or(0, |t| t.vocabulary().len()),
            "instructions": texts.len(),
        }),
    )
    .with_load_average();
    let mut rng = seeding::rng(args.seed);
    time_chains(
        &policy,
        &args.batches,
        args.repeats,
        |b, rng| random_obs(&policy, b, -1.0..1.0, &texts, rng),
        &mut rng,
        device,
        &mut lines,
    )?;
    let pretrain = &cfg.pretrain;
    let b = pretrain.batch_size;
    // The whole batch at once (what PyTorch's step does), then, in a run with as many threads,
    // as `diffrl pretrain` cuts it ([pretrain] threads shards, each on its own OS thread
    // whatever RAYON_NUM_THREADS says, so its line's `threads` is the shard count).
    let mut shard_counts = vec![1];
    if pretrain.threads > 1 && threads >= pretrain.threads {
        shard_counts.push(pretrain.threads);
    }
    for shards in shard_counts {
        let mut optim = Adam::new(pretrain.weight_decay as f32, shards, device);
        let ms = time_bc_steps(
            &mut train,
            &mut optim,
            pretrain.lr,
            b,
            shards,
            args.repeats.min(30),
            |p, rng| BcBatch::random(p, b, &tokens, rng),
            &mut rng,
            device,
        )?;
        let (what, threads) = match shards {
            1 => (format!("train_b{b}"), threads),
            s => (format!("train_b{b}_shards{s}"), s),
        };
        lines.emit(
            &what,
            ms,
            serde_json::json!({"shards": shards, "threads": threads}),
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::env_setting;

    #[test]
    fn env_settings_parse_toml_values_and_bare_words() {
        let (k, v) = env_setting("arm_joints=impulse").unwrap();
        assert_eq!(
            (k.as_str(), v),
            ("arm_joints", toml::Value::from("impulse"))
        );
        let (k, v) = env_setting(" max_episode_steps = 80").unwrap();
        assert_eq!(
            (k.as_str(), v),
            ("max_episode_steps", toml::Value::from(80))
        );
        assert_eq!(
            env_setting("obs=\"state\"").unwrap().1,
            toml::Value::from("state")
        );
        for bad in ["arm_joints", "=impulse"] {
            let e = env_setting(bad).unwrap_err().to_string();
            assert!(e.contains(bad), "{e}");
        }
    }
}
