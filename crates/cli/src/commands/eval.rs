//! `diffrl eval`: seeded evaluation of a policy checkpoint in the simulator, or through a
//! policy server (--remote), or over a domain-randomisation sweep (--randomize).

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use burn::tensor::backend::AutodiffBackend;
use diffrl_core::record::Timeline;
use diffrl_policy::{SampleMode, checkpoint};

use crate::config;
use crate::train::{EvalArgs, check_spec, env_spec, print_report, run_eval, write_report};
use crate::viz::Recording;

/// `diffrl eval`.
pub fn eval_cmd(
    args: &EvalArgs,
    rerun: Option<&diffrl_viz::RerunSink>,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    if let Some(sweep) = &args.randomize {
        return crate::robustness::robustness_cmd(args, sweep, rerun, out);
    }
    if let Some(url) = &args.remote {
        crate::viz::ignored(rerun, "eval --remote");
        return crate::serve::remote_eval_cmd(args, url, out);
    }
    let (mut cfg, _) = config::load(args.config.as_deref())?;
    if let Some(d) = args.action_delay {
        config::set_action_delay(&mut cfg, d)?;
    }
    let episodes = args.episodes.unwrap_or(cfg.eval.episodes);
    anyhow::ensure!(episodes >= 1, "--episodes must be at least 1");
    let seed = args.seed.unwrap_or(cfg.eval.seed);
    let mode = if args.stochastic {
        SampleMode::Stochastic
    } else {
        SampleMode::Deterministic
    };
    let recording = Recording::open(
        rerun,
        diffrl_viz::RerunSink::Off,
        "eval",
        Timeline::EnvStep,
        out,
    )?;
    let report = with_device!(args.device, |device, B| {
        let (policy, _) =
            checkpoint::load::<<B as AutodiffBackend>::InnerBackend>(args.policy_dir(), &device)
                .with_context(|| format!("loading the policy {}", args.policy_dir().display()))?;
        check_spec(
            &policy.spec,
            &env_spec(&cfg)?,
            &format!("the policy {}", args.policy_dir().display()),
        )?;
        run_eval(
            &cfg,
            &policy,
            &device,
            episodes,
            seed,
            mode,
            recording.recorder(),
        )
        .map_err(anyhow::Error::from)
    })?;
    let path = args.out.clone().unwrap_or_else(|| {
        args.policy_dir()
            .parent()
            .map_or_else(|| PathBuf::from("eval.json"), |p| p.join("eval.json"))
    });
    write_report(&path, &report)?;
    print_report(out, &report)?;
    writeln!(out, "wrote {}", path.display())?;
    Ok(())
}
