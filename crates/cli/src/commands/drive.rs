//! `diffrl sim drive kinematics|idm`: the driving simulator's vehicle models on inputs from the
//! command line, for checking against highway-env 1.12.1 (`tools/highway_check.sh`,
//! docs/driving.md).

use std::io::Write;
use std::path::Path;

use anyhow::{Context, bail};
use diffrl_drive::idm::{Idm, Leader};
use diffrl_drive::kinematics::{VehicleState, rollout};
use serde::Deserialize;
use serde_json::json;

use crate::commands::sim::SimArgs;

/// One IDM case of `--cases`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct IdmCase {
    speed: f64,
    target_speed: f64,
    front_speed: Option<f64>,
    gap: Option<f64>,
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path, what: &str) -> anyhow::Result<T> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading {what} {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{what} {}", path.display()))
}

/// Runs the model `args.model` names and prints its JSON lines.
pub fn sim(args: &SimArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    if args.seed.is_some() || args.init_state.is_some() || args.expert || args.config.is_some() {
        bail!("`diffrl sim drive` takes no --seed, --init-state, --expert or --config");
    }
    if !args.json {
        bail!("`diffrl sim drive` prints JSON lines only: add --json");
    }
    match args.model.as_deref() {
        Some("kinematics") => kinematics(args, out),
        Some("idm") => idm(args, out),
        Some(other) => bail!("unknown drive model {other:?}: kinematics or idm"),
        None => bail!("`diffrl sim drive` needs a model: kinematics or idm"),
    }
}

fn kinematics(args: &SimArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let (Some(state), Some(path), Some(dt)) = (&args.state, &args.actions, args.dt) else {
        bail!("drive kinematics needs --state X,Y,HEADING,SPEED, --actions FILE.json and --dt DT");
    };
    if args.cases.is_some() {
        bail!("--cases belongs to drive idm");
    }
    let values = crate::commands::sim::parse_state(state, "--state")?;
    let Ok(values) = <[f64; 4]>::try_from(values.as_slice()) else {
        bail!(
            "--state takes 4 values x,y,heading,speed, got {}",
            values.len()
        );
    };
    let start = VehicleState::from_array(values).context("--state")?;
    let actions: Vec<Vec<f64>> = read_json(path, "the actions file")?;
    let actions: Vec<[f64; 2]> = actions
        .iter()
        .enumerate()
        .map(|(i, a)| {
            <[f64; 2]>::try_from(a.as_slice()).map_err(|_| {
                anyhow::anyhow!(
                    "{}: action {i} has {} values; each is [steering, acceleration]",
                    path.display(),
                    a.len()
                )
            })
        })
        .collect::<anyhow::Result<_>>()?;
    let states = rollout(start, &actions, dt)
        .with_context(|| format!("--dt {dt} with the actions of {}", path.display()))?;
    for (step, s) in states.iter().enumerate() {
        writeln!(out, "{}", json!({"step": step, "state": s.to_array()}))?;
    }
    Ok(())
}

fn idm(args: &SimArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let Some(path) = &args.cases else {
        bail!("drive idm needs --cases FILE.json");
    };
    if args.state.is_some() || args.actions.is_some() || args.dt.is_some() {
        bail!("--state, --actions and --dt belong to drive kinematics");
    }
    let cases: Vec<IdmCase> = read_json(path, "the cases file")?;
    let idm = Idm::default();
    for (i, c) in cases.iter().enumerate() {
        let name = |field: &str| format!("{}: case {i}: {field}", path.display());
        for (field, v) in [
            ("speed", Some(c.speed)),
            ("target_speed", Some(c.target_speed)),
            ("front_speed", c.front_speed),
            ("gap", c.gap),
        ] {
            if let Some(v) = v {
                diffrl_drive::finite(|| name(field), v)?;
            }
        }
        let leader = match (c.front_speed, c.gap) {
            (Some(speed), Some(gap)) => Some(Leader { speed, gap }),
            (None, None) => None,
            _ => bail!(
                "{}: front_speed and gap are both numbers (a leader) or both null",
                name("leader")
            ),
        };
        let a = idm.acceleration(c.speed, c.target_speed, leader);
        writeln!(out, "{}", json!({"acceleration": a}))?;
    }
    Ok(())
}
