//! `diffrl bench TASK`: environment steps per second on one thread, for side-by-side
//! comparison with gym-pusht (tools/bench_pusht.sh runs both with the same workloads).

use std::io::Write;
use std::time::Instant;

use anyhow::Context;
use clap::{Args, ValueEnum};
use diffrl_core::Env;
use diffrl_core::seeding;
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
    /// A task (`pusht`: its default [env] settings), `policy` or `serve`.
    pub task: String,
    /// Observation mode: sets [env].obs (Push-T: state, keypoints or pixels; default: the
    /// task's default, keypoints for Push-T).
    #[arg(long)]
    pub obs: Option<String>,
    /// Action workload.
    #[arg(long, value_enum, default_value_t = Workload::Random)]
    pub workload: Workload,
    /// Environment steps to time.
    #[arg(long, default_value_t = 20_000)]
    pub steps: usize,
    /// Seed of resets and actions.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// `policy` only: timed repetitions per measurement (the median is reported).
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
    /// `policy` only: where the model runs.
    #[arg(long, value_enum, default_value_t = crate::device::DeviceArg::Cpu)]
    pub device: crate::device::DeviceArg,
    /// `serve` only: the checkpoint to serve.
    #[arg(long)]
    pub policy: Option<std::path::PathBuf>,
    /// `policy` only: the chain batch sizes to time (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 64])]
    pub batches: Vec<usize>,
    /// `policy` only: (environment step, denoising step) pairs per timed GRPO minibatch update
    /// (`[grpo] minibatch`'s default).
    #[arg(long, default_value_t = 2048)]
    pub pairs: usize,
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
            "unknown benchmark {:?}; available: {}, policy, serve",
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
        serde_json::json!({"impl": "diffrl", "obs": obs, "workload": workload, "steps": args.steps, "seconds": secs,
                           "steps_per_s": args.steps as f64 / secs, "resets": resets, "successes": successes})
    )?;
    Ok(())
}

/// Median of `v` seconds in milliseconds (the upper middle value of an even count).
fn median_ms(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    diffrl_core::stats::nearest_rank_quantile(&v, 0.5).unwrap_or(f64::NAN) * 1e3
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
    use burn::optim::{AdamWConfig, Optimizer};
    use burn::tensor::{Tensor, TensorData};
    use diffrl_core::normalize::Normalizer;
    use diffrl_policy::encoder::ObsTensors;
    use diffrl_policy::{Normalizers, ObsBatch, Policy, PolicyConfig, PolicySpec, SampleMode};
    let sync = || B::sync(device).map_err(|e| anyhow::anyhow!("device sync: {e:?}"));
    let backend = format!("{:?}", args.device).to_lowercase();

    anyhow::ensure!(args.repeats >= 1, "--repeats must be at least 1");
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
    anyhow::ensure!(
        args.batches.iter().all(|&b| b >= 1),
        "--batches: every batch size must be at least 1"
    );
    anyhow::ensure!(args.pairs >= 1, "--pairs must be at least 1");
    let params = burn::module::Module::num_params(&policy.model);
    for &b in &args.batches {
        let obs = ObsBatch {
            batch: b,
            state: (0..b * 2 * 5)
                .map(|_| rng.random_range(0.0..512.0))
                .collect(),
            image: None,
            text: None,
        };
        let mut times = Vec::new();
        for i in 0..args.repeats + 5 {
            let t = Instant::now();
            let act = policy.act(None, &obs, SampleMode::Stochastic, true, &mut rng, device)?;
            let _ = act.sample.logp.map(|l| l.into_data());
            if i >= 5 {
                times.push(t.elapsed().as_secs_f64());
            }
        }
        writeln!(
            out,
            "{}",
            serde_json::json!({"impl": "diffrl", "device": backend, "what": format!("chain_b{b}"), "median_ms": median_ms(times), "threads": threads, "params": params})
        )?;
    }
    let mut train = Policy::<B>::new(cfg, spec, norm, args.seed, device)?;
    let mut optim = AdamWConfig::new().init();
    let b = 256;
    // One BC step; then the same step with the batch cut into shards on as many threads
    // ([pretrain].threads).
    for shards in [1usize, 2, 4].into_iter().filter(|&s| s <= threads.max(2)) {
        let mut times = Vec::new();
        for i in 0..args.repeats.min(30) + 3 {
            let o: Vec<f32> = (0..b * 2 * 5)
                .map(|_| rng.random_range(-1.0..1.0))
                .collect();
            let a: Vec<f32> = (0..b * 16 * 2)
                .map(|_| rng.random_range(-1.0..1.0))
                .collect();
            let step_seed = rng.random::<u64>();
            let t = Instant::now();
            let (grads, _) = diffrl_learn::parallel::sharded_grads(
                &train.model,
                b,
                shards,
                |k, rows, model| {
                    let n = rows.len();
                    let obs = ObsTensors {
                        state: Tensor::from_data(
                            TensorData::new(o[rows.start * 10..rows.end * 10].to_vec(), [n, 2, 5]),
                            device,
                        ),
                        image: None,
                        text: None,
                    };
                    let actions = Tensor::from_data(
                        TensorData::new(a[rows.start * 32..rows.end * 32].to_vec(), [n, 16, 2]),
                        device,
                    );
                    let mut r = seeding::rng(seeding::derive(step_seed, k as u64));
                    Ok(train
                        .with_model(model.clone())
                        .bc_loss(&obs, actions, &mut r))
                },
            )?;
            train.model = optim.step(1e-4, train.model.clone(), grads);
            sync()?;
            if i >= 3 {
                times.push(t.elapsed().as_secs_f64());
            }
        }
        writeln!(
            out,
            "{}",
            serde_json::json!({"impl": "diffrl", "device": backend, "what": if shards == 1 { "train_b256".to_string() } else { format!("train_b256_shards{shards}") }, "median_ms": median_ms(times), "threads": if shards == 1 { threads } else { shards }, "params": params})
        )?;
    }
    // One GRPO minibatch update (crates/learn/src/surrogate.rs): the log-probs of `pairs`
    // stored (x_k, x_{k-1}) pairs at mixed chain steps under the current weights, the clipped
    // surrogate, its backward pass and an AdamW step.
    let n = args.pairs;
    let k = train.process().map_or(1, |p| p.ft_steps());
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
        train.model = optim.step(1e-4, train.model.clone(), grads);
        sync()?;
        if i >= 3 {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    let ms = median_ms(times);
    writeln!(
        out,
        "{}",
        serde_json::json!({"impl": "diffrl", "device": backend, "what": format!("update_pairs{n}"), "median_ms": ms, "pairs_per_s": n as f64 / (ms / 1e3), "threads": threads, "params": params})
    )?;
    Ok(())
}
