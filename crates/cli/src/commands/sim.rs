//! `diffrl sim TASK`: replay actions or the expert from a chosen start and print each step.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;
use diffrl_core::Env;
use diffrl_core::dyn_env::DynEnv;
use diffrl_core::record::{Recorder, StepSeries, Timeline};
use diffrl_core::task::TaskEnv;
use serde_json::json;

use crate::commands::demos::{Dart, run_expert_from_current};

/// Arguments of `diffrl sim TASK`.
#[derive(Debug, Args)]
pub struct SimArgs {
    /// Task (`pusht`; crates/cli/src/tasks.rs lists them), or `drive` for its vehicle-model
    /// checks.
    pub task: String,
    /// With `drive`: the model to run, `kinematics` (highway-env's `Vehicle.step`: needs
    /// --state, --actions, --dt) or `idm` (`IDMVehicle.acceleration`: needs --cases).
    pub model: Option<String>,
    /// drive kinematics: the start state `x,y,heading,speed` (m, m, rad, m/s).
    #[arg(long, value_name = "X,Y,HEADING,SPEED")]
    pub state: Option<String>,
    /// drive kinematics: seconds each action is held.
    #[arg(long, value_name = "DT")]
    pub dt: Option<f64>,
    /// drive idm: JSON file holding an array of
    /// `{"speed", "target_speed", "front_speed", "gap"}` (the last two null without a leader).
    #[arg(long, value_name = "FILE.json")]
    pub cases: Option<PathBuf>,
    /// Start from this full state instead of a seeded reset (Push-T: `ax,ay,bx,by,angle` with
    /// gym-pusht's `reset_to_state` meaning, legacy quirk included: the block position is set
    /// before the angle).
    #[arg(long, value_name = "AX,AY,BX,BY,ANGLE", conflicts_with = "seed")]
    pub init_state: Option<String>,
    /// Seeded reset instead of --init-state.
    #[arg(long)]
    pub seed: Option<u64>,
    /// JSON file holding an array of actions (Push-T: [x, y] targets) to execute.
    #[arg(long, value_name = "FILE.json", conflicts_with = "expert")]
    pub actions: Option<PathBuf>,
    /// Let the configured expert ([expert]) act until the episode ends.
    #[arg(long)]
    pub expert: bool,
    /// Print one JSON object per line (step 0 = the reset observation).
    #[arg(long)]
    pub json: bool,
    /// Run config whose [env] and [expert] tables apply (default: the task's own config).
    #[arg(long)]
    pub config: Option<PathBuf>,
}

/// The comma-separated finite numbers of `s`, given as `flag` (named in errors).
pub(crate) fn parse_state(s: &str, flag: &str) -> anyhow::Result<Vec<f64>> {
    let v: Vec<f64> = s
        .split(',')
        .map(|x| {
            x.trim()
                .parse::<f64>()
                .with_context(|| format!("{flag}: {x:?} is not a number"))
        })
        .collect::<anyhow::Result<_>>()?;
    if let Some(i) = v.iter().position(|x| !x.is_finite()) {
        bail!("{flag}: component {i} is not finite");
    }
    Ok(v)
}

fn read_actions(path: &PathBuf, dim: usize) -> anyhow::Result<Vec<Vec<f32>>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading actions file {}", path.display()))?;
    let v: Vec<Vec<f64>> = serde_json::from_str(&text).with_context(|| {
        format!(
            "{}: expected a JSON array of actions of {dim} numbers",
            path.display()
        )
    })?;
    v.iter()
        .enumerate()
        .map(|(i, a)| {
            if a.len() != dim {
                bail!(
                    "{}: action {i} has {} values, expected {dim}",
                    path.display(),
                    a.len()
                );
            }
            Ok(a.iter().map(|&x| x as f32).collect())
        })
        .collect()
}

/// Adds the task's named parts of the state (an arm's `ee_pose`, `cube_pose`) to a JSON line.
fn with_named_state(v: &mut serde_json::Value, env: &DynEnv) {
    if let Some(map) = v.as_object_mut() {
        for (name, values) in env.named_state() {
            map.insert(name.into(), json!(values));
        }
    }
}

/// Adds an observation's text (a language task's instruction) to a JSON line as
/// `instruction`; nothing for tasks without text.
fn with_text(v: &mut serde_json::Value, text: Option<&str>) {
    if let (Some(map), Some(text)) = (v.as_object_mut(), text) {
        map.insert("instruction".into(), json!(text));
    }
}

/// Logs the scene (and the step's reward) at a new `env_step`.
fn record(rec: &dyn Recorder, env: &DynEnv, reward: Option<f32>) {
    if !rec.enabled() {
        return;
    }
    let t = rec.tick(Timeline::EnvStep);
    if let Some(s) = env.scene() {
        rec.scene(&s);
    }
    if let Some(r) = reward {
        rec.step_series(StepSeries::Reward, t, &[f64::from(r)]);
    }
}

/// Runs the command, writing lines to `out`; `--rerun` records the scene of every step.
pub fn run(
    args: &SimArgs,
    rerun: Option<&diffrl_viz::RerunSink>,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    if args.task == "drive" {
        return crate::commands::drive::sim(args, out);
    }
    if let Some(model) = &args.model {
        bail!("{model:?}: only `diffrl sim drive` takes a model (kinematics or idm)");
    }
    if args.state.is_some() || args.dt.is_some() || args.cases.is_some() {
        bail!("--state, --dt and --cases belong to `diffrl sim drive kinematics|idm`");
    }
    let (cfg, _) = crate::config::load_for(&args.task, args.config.as_deref())?;
    let recording = crate::viz::Recording::open(
        rerun,
        diffrl_viz::RerunSink::Off,
        "sim",
        Timeline::EnvStep,
        &mut std::io::stderr(),
    )?;
    let rec = recording.recorder();
    let mut env = cfg.env.build();
    let actions = match (&args.actions, args.expert) {
        (Some(p), false) => Some(read_actions(p, env.action_space().dim())?),
        (None, true) => None,
        _ => bail!("give either --actions FILE.json or --expert"),
    };
    let seed = args.seed.unwrap_or(0);
    let obs = match &args.init_state {
        Some(s) => env
            .reset_to_state(&parse_state(s, "--init-state")?, seed)
            .context("--init-state")?,
        None => env.reset(seed),
    };
    let line = |out: &mut dyn Write, v: serde_json::Value| -> anyhow::Result<()> {
        Ok(writeln!(out, "{v}")?)
    };
    record(rec, &env, None);
    if args.json {
        let mut v = json!({"step": 0, "state": env.true_state()});
        with_named_state(&mut v, &env);
        with_text(&mut v, obs.text.as_deref());
        line(out, v)?;
    } else {
        writeln!(out, "step 0: observation {:?}", obs.state)?;
        if let Some(text) = &obs.text {
            writeln!(out, "instruction: {text}")?;
        }
    }
    let mut step = 0usize;
    let mut report = |env: &DynEnv,
                      action: &[f32],
                      r: &diffrl_core::StepResult,
                      out: &mut dyn Write|
     -> anyhow::Result<()> {
        step += 1;
        record(rec, env, Some(r.reward));
        if args.json {
            let mut v = json!({"step": step, "action": action, "state": env.true_state(), "reward": r.reward,
                               "coverage": r.info.score, "score": r.info.score, "success": r.info.success,
                               "clamped": r.info.clamped, "terminated": r.terminated, "truncated": r.truncated});
            with_named_state(&mut v, env);
            with_text(&mut v, r.obs.text.as_deref());
            line(out, v)
        } else {
            Ok(writeln!(
                out,
                "step {step:3}: {}",
                env.describe_step(action, r)
            )?)
        }
    };
    match actions {
        Some(acts) => {
            for a in acts {
                let r = env.step(&a)?;
                report(&env, &a, &r, out)?;
                if r.terminated || r.truncated {
                    break;
                }
            }
        }
        None => {
            let mut expert = cfg.expert.build(seed).with_context(|| {
                format!("--expert: task {} has no expert", cfg.env.task().name())
            })?;
            let mut err = None;
            run_expert_from_current(
                &mut env,
                obs,
                &mut expert,
                &cfg.env.task().dataset().instruction,
                args.seed,
                &mut Dart::new(0.0, 0),
                &mut |env, a, r| {
                    if err.is_none() {
                        err = report(env, a, r, out).err();
                    }
                },
            )?;
            if let Some(e) = err {
                return Err(e);
            }
        }
    }
    Ok(())
}
