//! `diffrl serve` (the openpi-protocol policy server), `diffrl eval --remote` (simulated
//! episodes through a server, the simulator standing in for the robot) and
//! `diffrl bench serve` (a bounded loopback load test).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use burn::tensor::backend::AutodiffBackend;
use clap::Args;
use diffrl_core::seeding::{derive, rng};
use diffrl_learn::LearnError;
use diffrl_learn::eval::{Actor, EvalReport, evaluate_actor};
use diffrl_policy::{ObsBatch, SampleMode, checkpoint};
use diffrl_serve::{Client, Observation, PolicyRunner, Server, ServerConfig, shutdown_signal};
use futures_util::future::join_all;
use serde::Serialize;
use serde_json::json;

use crate::config::RunConfig;
use crate::device::DeviceArg;
use crate::envs::{env_spec, vec_env};
use crate::progress::bar;

/// Arguments of `diffrl serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Policy checkpoint folder (model.safetensors + policy.json).
    #[arg(long)]
    pub policy: PathBuf,
    /// Address to bind; loopback by default (use 0.0.0.0 to accept other machines).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port (openpi's default; 0 picks a free one and prints it).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Require `Authorization: Api-Key <KEY>` (also read from DIFFRL_API_KEY).
    #[arg(long, env = "DIFFRL_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Most requests answered by one policy call (1 = no batching).
    #[arg(long, default_value_t = 64)]
    pub max_batch: usize,
    /// Milliseconds to wait for more requests after the first (0 = batch only what is
    /// already queued, adding no latency).
    #[arg(long, default_value_t = 0.0)]
    pub batch_window_ms: f64,
    /// Requests waiting for the policy before clients are slowed down.
    #[arg(long, default_value_t = 256)]
    pub queue: usize,
    /// Largest accepted message in MiB.
    #[arg(long, default_value_t = 16.0)]
    pub max_message_mb: f64,
    /// Most connections at once.
    #[arg(long, default_value_t = 256)]
    pub max_connections: usize,
    /// Root of the per-request noise seeds.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stochastic chains (eta, min std) instead of deterministic DDIM.
    #[arg(long)]
    pub stochastic: bool,
    /// Control frequency reported to clients (Hz).
    #[arg(long, default_value_t = 10.0)]
    pub fps: f64,
    /// Device.
    #[arg(long, value_enum, default_value_t = DeviceArg::Cpu)]
    pub device: DeviceArg,
    /// Do not log connections and refused requests.
    #[arg(long)]
    pub quiet: bool,
}

impl ServeArgs {
    fn server_config(&self) -> anyhow::Result<ServerConfig> {
        anyhow::ensure!(
            self.batch_window_ms.is_finite() && self.batch_window_ms >= 0.0,
            "--batch-window-ms must be >= 0"
        );
        anyhow::ensure!(
            self.max_message_mb.is_finite() && self.max_message_mb > 0.0,
            "--max-message-mb must be > 0"
        );
        Ok(ServerConfig {
            host: self.host.clone(),
            port: self.port,
            api_key: self.api_key.clone(),
            max_batch: self.max_batch,
            batch_window: Duration::from_secs_f64(self.batch_window_ms / 1e3),
            queue: self.queue,
            max_message_bytes: (self.max_message_mb * 1024.0 * 1024.0) as usize,
            max_connections: self.max_connections,
            seed: self.seed,
            ..ServerConfig::default()
        })
    }
}

fn runtime(threads: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// Serves a checkpoint until SIGINT/SIGTERM.
pub fn serve_cmd(args: &ServeArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let cfg = args.server_config()?;
    let mode = if args.stochastic {
        SampleMode::Stochastic
    } else {
        SampleMode::Deterministic
    };
    let name = args
        .policy
        .canonicalize()
        .unwrap_or_else(|_| args.policy.clone())
        .display()
        .to_string();
    let model: Box<dyn diffrl_serve::ActionModel> = with_device!(args.device, |device, B| {
        type I = <B as AutodiffBackend>::InnerBackend;
        let (policy, _) = checkpoint::load::<I>(&args.policy, &device).with_context(|| {
            format!(
                "the server cannot start: loading the policy {}",
                args.policy.display()
            )
        })?;
        Ok::<Box<dyn diffrl_serve::ActionModel>, anyhow::Error>(Box::new(PolicyRunner::new(
            policy, device, mode, name, args.fps,
        )))
    })?;
    let spec = model.spec().clone();
    let rt = runtime(2)?;
    let stats = rt.block_on(async {
        let server = Server::bind(cfg.clone(), model)
            .await?
            .with_log(!args.quiet);
        let addr = server.local_addr()?;
        writeln!(
            out,
            "serving {} on ws://{addr} (To {}, state dim {}, Ta {}, Da {}, {} chains; max batch {}, \
             window {} ms{}); GET /healthz; Ctrl-C stops",
            spec.name,
            spec.obs_horizon,
            spec.state_dim,
            spec.action_horizon,
            spec.action_dim,
            if args.stochastic {
                "stochastic"
            } else {
                "deterministic"
            },
            cfg.max_batch,
            args.batch_window_ms,
            if cfg.api_key.is_some() {
                ", API key required"
            } else {
                ""
            }
        )?;
        out.flush()?;
        let stats = server.run(shutdown_signal()).await?;
        anyhow::Ok(stats)
    })?;
    writeln!(
        out,
        "stopped: {} connections, {} requests answered, {} refused, {} policy calls",
        stats.connections, stats.answered, stats.refused, stats.batches
    )?;
    Ok(())
}

/// Latency of the remote round trips of an evaluation.
#[derive(Debug, Clone, Serialize)]
pub struct RemoteTiming {
    /// Requests sent.
    pub requests: usize,
    /// Median round trip, injected latency included (ms).
    pub p50_ms: f64,
    /// 99th percentile round trip (ms).
    pub p99_ms: f64,
    /// Median policy time the server reported (ms).
    pub infer_p50_ms: f64,
    /// Injected one-way latency x 2 per request (ms).
    pub injected_round_trip_ms: f64,
}

/// The server as an [`Actor`]: one connection per environment, each sending whole observation
/// windows with a seed derived from (root seed, environment, call index), so a remote
/// evaluation is reproducible whatever the timing.
struct RemoteActor {
    rt: tokio::runtime::Runtime,
    clients: Vec<Client>,
    calls: Vec<u64>,
    seed: u64,
    one_way: Duration,
    obs_horizon: usize,
    action_horizon: usize,
    action_dim: usize,
    state_dim: usize,
    round_trips: Vec<f64>,
    infer: Vec<f64>,
}

impl Actor for RemoteActor {
    fn obs_horizon(&self) -> usize {
        self.obs_horizon
    }
    fn action_horizon(&self) -> usize {
        self.action_horizon
    }
    fn action_dim(&self) -> usize {
        self.action_dim
    }
    fn images(&self) -> bool {
        false
    }
    fn act(
        &mut self,
        envs: &[usize],
        obs: &ObsBatch,
        _rec: &dyn diffrl_core::record::Recorder,
    ) -> Result<Vec<f32>, LearnError> {
        let per = self.obs_horizon * self.state_dim;
        let mut requests = Vec::with_capacity(envs.len());
        for (j, &i) in envs.iter().enumerate() {
            requests.push(Observation {
                state: obs.state[j * per..(j + 1) * per].to_vec(),
                state_shape: vec![self.obs_horizon, self.state_dim],
                seed: Some(derive(derive(self.seed, i as u64), self.calls[i])),
                prompt: obs.text.as_ref().map(|t| t[j].clone()),
                ..Observation::default()
            });
            self.calls[i] += 1;
        }
        let one_way = self.one_way;
        let mut by_env: Vec<Option<&mut Client>> = self.clients.iter_mut().map(Some).collect();
        let futures: Vec<_> = envs
            .iter()
            .zip(&requests)
            .map(|(&i, req)| {
                let client = by_env[i]
                    .take()
                    .expect("each environment asks once per call");
                async move {
                    let start = Instant::now();
                    tokio::time::sleep(one_way).await;
                    let reply = client.infer(req).await;
                    tokio::time::sleep(one_way).await;
                    (reply, start.elapsed().as_secs_f64() * 1e3)
                }
            })
            .collect();
        let replies = self.rt.block_on(join_all(futures));
        let mut actions = Vec::with_capacity(envs.len() * self.action_horizon * self.action_dim);
        for ((reply, ms), &i) in replies.into_iter().zip(envs) {
            let r = reply.map_err(|e| LearnError::Actor(format!("environment {i}: {e}")))?;
            if r.shape != [self.action_horizon, self.action_dim] {
                return Err(LearnError::Actor(format!(
                    "the server sent actions of shape {:?}, its metadata promised [{}, {}]",
                    r.shape, self.action_horizon, self.action_dim
                )));
            }
            self.round_trips.push(ms);
            self.infer.extend(r.infer_ms);
            actions.extend(r.actions);
        }
        Ok(actions)
    }
}

/// Sorts `v` and returns its nearest-rank `q` quantile (NaN when empty).
fn percentile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    diffrl_core::stats::nearest_rank_quantile(v, q).unwrap_or(f64::NAN)
}

/// State width the server's metadata declares for `observation.state`.
fn metadata_state_dim(client: &Client) -> Option<usize> {
    use diffrl_serve::msgpack::get;
    let rmpv::Value::Map(m) = client.metadata() else {
        return None;
    };
    let rmpv::Value::Map(obs) = get(m, "observation")? else {
        return None;
    };
    let rmpv::Value::Map(state) = get(obs, "observation.state")? else {
        return None;
    };
    match get(state, "shape")? {
        rmpv::Value::Array(d) => d.last()?.as_u64().map(|x| x as usize),
        _ => None,
    }
}

/// Plays seeded episodes of the configured environment through a policy server.
pub fn remote_eval(
    cfg: &RunConfig,
    url: &str,
    api_key: Option<&str>,
    episodes: usize,
    seed: u64,
    latency_ms: f64,
) -> anyhow::Result<(EvalReport, RemoteTiming)> {
    anyhow::ensure!(
        latency_ms.is_finite() && latency_ms >= 0.0,
        "--latency-ms must be >= 0"
    );
    let env = env_spec(cfg)?;
    anyhow::ensure!(
        env.image.is_none(),
        "--remote evaluates state observations only so far ([env].obs = \"pixels\" is not sent)"
    );
    let mut venv = vec_env(cfg, cfg.eval.envs.min(episodes.max(1)));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let clients = rt.block_on(async {
        let mut v = Vec::new();
        for _ in 0..venv.len() {
            v.push(Client::connect(url, api_key).await?);
        }
        Ok::<_, diffrl_serve::ServeError>(v)
    })?;
    let meta = |k: &str| {
        clients[0]
            .metadata_usize(k)
            .with_context(|| format!("the server at {url} sent no {k:?} in its metadata"))
    };
    let (to, ta, da) = (
        meta("obs_horizon")?,
        meta("action_horizon")?,
        meta("action_dim")?,
    );
    let ds = metadata_state_dim(&clients[0]).unwrap_or(0);
    if ds != env.state_dim || da != env.action_dim {
        bail!(
            "the server's policy takes state dim {ds} and gives action dim {da}, but the \
             configured environment has {} and {} (check [env].obs)",
            env.state_dim,
            env.action_dim
        );
    }
    let mut actor = RemoteActor {
        rt,
        calls: vec![0; clients.len()],
        clients,
        seed,
        one_way: Duration::from_secs_f64(latency_ms / 2e3),
        obs_horizon: to,
        action_horizon: ta,
        action_dim: da,
        state_dim: ds,
        round_trips: Vec::new(),
        infer: Vec::new(),
    };
    let pb = bar(
        episodes as u64,
        "  remote eval [{bar:30}] {pos}/{len} episodes {elapsed_precise} (eta {eta})",
    );
    let report = evaluate_actor(
        &mut venv,
        &mut actor,
        episodes,
        seed,
        &mut |d, _| pb.set_position(d as u64),
        &diffrl_core::record::NoRecorder,
    );
    pb.finish_and_clear();
    let report = report?;
    let timing = RemoteTiming {
        requests: actor.round_trips.len(),
        p50_ms: percentile(&mut actor.round_trips, 0.5),
        p99_ms: percentile(&mut actor.round_trips, 0.99),
        infer_p50_ms: percentile(&mut actor.infer, 0.5),
        injected_round_trip_ms: latency_ms,
    };
    let RemoteActor { rt, clients, .. } = actor;
    rt.block_on(async {
        for c in clients {
            let _ = c.close().await;
        }
    });
    Ok((report, timing))
}

/// Arguments of `diffrl bench serve`, parsed from `diffrl bench`'s flags.
pub struct LoadArgs<'a> {
    /// The checkpoint to serve.
    pub policy: &'a Path,
    /// Concurrent clients.
    pub clients: usize,
    /// Requests per client.
    pub requests: usize,
    /// Sequential requests for the overhead measurement.
    pub repeats: usize,
    /// Noise seed.
    pub seed: u64,
}

/// A `diffrl serve` child process on a free loopback port, killed on drop.
struct ServerProcess {
    child: Child,
    url: String,
}

impl ServerProcess {
    fn start(policy: &Path, extra: &[&str]) -> anyhow::Result<Self> {
        use std::io::BufRead;
        let exe = std::env::current_exe().context("finding the diffrl binary")?;
        let mut child = Command::new(exe)
            .args(["serve", "--port", "0", "--quiet", "--policy"])
            .arg(policy)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting `diffrl serve`")?;
        let stdout = child.stdout.take().context("no stdout")?;
        let mut line = String::new();
        std::io::BufReader::new(stdout).read_line(&mut line)?;
        let url = line
            .split_whitespace()
            .find(|w| w.starts_with("ws://"))
            .map(str::to_owned);
        match url {
            Some(url) => Ok(Self { child, url }),
            None => {
                let _ = child.kill();
                bail!("`diffrl serve` did not start: {line:?}")
            }
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug, Serialize)]
struct LoadResult {
    requests_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    mean_batch: f64,
}

fn observation(policy_state_dim: usize, to: usize, k: usize) -> Observation {
    Observation {
        state: (0..to * policy_state_dim)
            .map(|d| 100.0 + ((k * 31 + d * 7) % 300) as f32)
            .collect(),
        state_shape: vec![to, policy_state_dim],
        ..Observation::default()
    }
}

async fn load(url: &str, clients: usize, requests: usize) -> anyhow::Result<LoadResult> {
    let mut conns = Vec::new();
    for _ in 0..clients {
        conns.push(Client::connect(url, None).await?);
    }
    let to = conns[0].metadata_usize("obs_horizon").unwrap_or(1);
    let ds = metadata_state_dim(&conns[0]).unwrap_or(0);
    let start = Instant::now();
    let tasks: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(c, mut client)| {
            tokio::spawn(async move {
                let mut lat = Vec::with_capacity(requests);
                let mut batch = 0usize;
                for k in 0..requests {
                    let obs = observation(ds, to, c * requests + k);
                    let t = Instant::now();
                    let r = client.infer(&obs).await?;
                    lat.push(t.elapsed().as_secs_f64() * 1e3);
                    batch += r.batch_size.unwrap_or(1);
                }
                let _ = client.close().await;
                Ok::<_, diffrl_serve::ServeError>((lat, batch))
            })
        })
        .collect();
    let mut lat = Vec::new();
    let mut batch = 0;
    for t in tasks {
        let (l, b) = t.await??;
        lat.extend(l);
        batch += b;
    }
    let secs = start.elapsed().as_secs_f64();
    let n = lat.len();
    Ok(LoadResult {
        requests_per_s: n as f64 / secs,
        p50_ms: percentile(&mut lat, 0.5),
        p99_ms: percentile(&mut lat, 0.99),
        mean_batch: batch as f64 / n as f64,
    })
}

/// The load benchmark: in-process inference vs one sequential client (serving overhead), then
/// `clients` x `requests` with and without batching. Loopback only; the server runs in its
/// own process.
pub fn bench_serve(args: &LoadArgs<'_>, out: &mut dyn Write) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.clients >= 1 && args.requests >= 1 && args.repeats >= 1,
        "--clients, --requests and --repeats must be at least 1"
    );
    anyhow::ensure!(
        args.clients * args.requests <= 100_000,
        "at most 100000 requests in all (a bounded benchmark)"
    );
    let device = Default::default();
    let (policy, _) = checkpoint::load::<diffrl_policy::CpuBackend>(args.policy, &device)
        .with_context(|| format!("loading the policy {}", args.policy.display()))?;
    let (to, ds) = (policy.config.obs_horizon, policy.spec.state_dim);
    anyhow::ensure!(
        policy.spec.image.is_none(),
        "the load benchmark sends states only; this policy sees pixels"
    );
    anyhow::ensure!(
        !policy.spec.text,
        "the load benchmark sends no prompt; this policy reads a text instruction"
    );
    // 1. In-process batch-1 calls (what the server does for one request) interleaved with
    // round trips of one sequential client to a server without batching, so that drift of the
    // machine hits both alike.
    let rt = runtime(2)?;
    let server = ServerProcess::start(args.policy, &["--max-batch", "1"])?;
    let (mut inproc, mut rtt, mut beyond) = (Vec::new(), Vec::new(), Vec::new());
    rt.block_on(async {
        let mut client = Client::connect(&server.url, None).await?;
        for k in 0..args.repeats + 5 {
            let o = observation(ds, to, k);
            let obs = ObsBatch {
                batch: 1,
                state: o.state.clone(),
                image: None,
                text: None,
            };
            let t = Instant::now();
            policy.act_rows(
                &obs,
                SampleMode::Deterministic,
                &mut [rng(derive(args.seed, k as u64))],
                &device,
            )?;
            let local = t.elapsed().as_secs_f64() * 1e3;
            let t = Instant::now();
            let r = client.infer(&o).await?;
            let round_trip = t.elapsed().as_secs_f64() * 1e3;
            if k >= 5 {
                inproc.push(local);
                rtt.push(round_trip);
                beyond.extend(r.infer_ms.map(|i| round_trip - i));
            }
        }
        anyhow::Ok(())
    })?;
    drop(server);
    let inproc_p50 = percentile(&mut inproc, 0.5);
    let single = (percentile(&mut rtt, 0.5), percentile(&mut beyond, 0.5));
    // 3. Many clients, without and with batching.
    let unbatched = {
        let server = ServerProcess::start(args.policy, &["--max-batch", "1"])?;
        rt.block_on(load(&server.url, args.clients, args.requests))?
    };
    let batched = {
        let server = ServerProcess::start(args.policy, &["--max-batch", "64"])?;
        rt.block_on(load(&server.url, args.clients, args.requests))?
    };
    let result = json!({
        "bench": "serve",
        "policy": args.policy.display().to_string(),
        "clients": args.clients,
        "requests_per_client": args.requests,
        "in_process_p50_ms": inproc_p50,
        "single_client": {
            "round_trip_p50_ms": single.0,
            "overhead_p50_ms": single.0 - inproc_p50,
            "round_trip_minus_server_infer_p50_ms": single.1,
        },
        "unbatched": unbatched,
        "batched": batched,
    });
    writeln!(out, "{result}")?;
    Ok(())
}

/// `diffrl eval --remote URL`: writes eval.json with the remote timing next to the results.
pub fn remote_eval_cmd(
    args: &crate::commands::eval::EvalArgs,
    url: &str,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let (mut cfg, _) = crate::config::load(args.config.as_deref())?;
    if let Some(d) = args.action_delay {
        crate::config::set_action_delay(&mut cfg, d)?;
    }
    let episodes = args.episodes.unwrap_or(cfg.eval.episodes);
    anyhow::ensure!(episodes >= 1, "--episodes must be at least 1");
    let seed = args.seed.unwrap_or(cfg.eval.seed);
    let (report, timing) = remote_eval(
        &cfg,
        url,
        args.api_key.as_deref(),
        episodes,
        seed,
        args.latency_ms,
    )?;
    let path = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("eval_remote.json"));
    let mut doc = serde_json::to_value(&report)?;
    doc["remote"] = json!({
        "url": url,
        "timing": timing,
        "action_delay_steps": crate::config::action_delay(&cfg),
    });
    diffrl_core::fs::write_atomic(&path, &serde_json::to_vec_pretty(&doc)?)
        .with_context(|| format!("writing {}", path.display()))?;
    crate::evaluation::print_report(out, &report)?;
    writeln!(
        out,
        "remote: {} requests, round trip p50 {:.2} ms / p99 {:.2} ms (injected {:.1} ms), server \
         policy time p50 {:.2} ms; action delay {} steps",
        timing.requests,
        timing.p50_ms,
        timing.p99_ms,
        timing.injected_round_trip_ms,
        timing.infer_p50_ms,
        crate::config::action_delay(&cfg)
    )?;
    writeln!(out, "wrote {}", path.display())?;
    Ok(())
}
