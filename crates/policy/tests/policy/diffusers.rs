//! Schedules and reverse steps against diffusers' DDPMScheduler / DDIMScheduler, from the
//! committed vectors in assets/testdata/diffusers_vectors.json (tools/diffusers_vectors.sh
//! regenerates them; these tests need no Python).

use crate::common;

use diffrl_policy::schedule::{SamplerKind, Schedule, ScheduleKind, chain_timesteps, step_coeffs};
use serde_json::Value;

fn vectors() -> Value {
    let path = common::repo_file("assets/testdata/diffusers_vectors.json");
    let text = std::fs::read_to_string(path).expect("committed diffusers vectors");
    serde_json::from_str(&text).expect("valid JSON")
}

fn kind(name: &str) -> ScheduleKind {
    match name {
        "squaredcos_cap_v2" => ScheduleKind::Cosine,
        "linear" => ScheduleKind::Linear,
        other => panic!("unknown schedule {other}"),
    }
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number"))
        .collect()
}

/// |a - b| <= tol * max(1, |b|): diffusers keeps its schedule in float32.
fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol * b.abs().max(1.0)
}

#[test]
fn schedules_match_diffusers() {
    let v = vectors();
    let schedules = v["schedules"].as_array().unwrap();
    assert!(schedules.len() >= 4);
    for s in schedules {
        let t = s["T"].as_u64().unwrap() as usize;
        let ours = Schedule::new(kind(s["name"].as_str().unwrap()), t);
        for (name, theirs, mine) in [
            ("betas", floats(&s["betas"]), &ours.betas),
            (
                "alphas_cumprod",
                floats(&s["alphas_cumprod"]),
                &ours.alphas_cumprod,
            ),
        ] {
            assert_eq!(theirs.len(), t);
            for (i, (a, b)) in mine.iter().zip(&theirs).enumerate() {
                assert!(
                    close(*a, *b, 1e-6),
                    "{} T={t} {name}[{i}]: {a} vs {b}",
                    s["name"]
                );
            }
        }
    }
}

/// Applies our step to (sample, model_output): returns (x0, mean, sigma).
fn our_step(
    case: &Value,
    sampler: SamplerKind,
    steps: usize,
    eta: f64,
) -> (Vec<f64>, Vec<f64>, f64) {
    let t_train = case["T"].as_u64().unwrap() as usize;
    let sched = Schedule::new(kind(case["schedule"].as_str().unwrap()), t_train);
    let t = case["t"].as_u64().unwrap() as usize;
    let c = step_coeffs(&sched, sampler, steps, eta)
        .into_iter()
        .find(|c| c.t == t)
        .expect("timestep on the chain");
    let x = floats(&case["sample"]);
    let eps = floats(&case["model_output"]);
    let x0: Vec<f64> = x
        .iter()
        .zip(&eps)
        .map(|(x, e)| ((x - c.sqrt_one_minus_abar * e) / c.sqrt_abar).clamp(-1.0, 1.0))
        .collect();
    let mean = x0
        .iter()
        .zip(&x)
        .map(|(x0, x)| c.c_x0 * x0 + c.c_xt * x)
        .collect();
    (x0, mean, c.sigma)
}

#[test]
fn ddpm_steps_match_diffusers() {
    let v = vectors();
    let cases = v["ddpm"].as_array().unwrap();
    assert!(!cases.is_empty());
    for case in cases {
        let t_train = case["T"].as_u64().unwrap() as usize;
        let (x0, mean, sigma) = our_step(case, SamplerKind::Ddpm, t_train, 1.0);
        let tag = format!("{} T={t_train} t={}", case["schedule"], case["t"]);
        for (a, b) in x0.iter().zip(floats(&case["pred_original_sample"])) {
            assert!(close(*a, b, 1e-4), "{tag} x0: {a} vs {b}");
        }
        let var = case["variance"].as_f64().unwrap();
        assert!(
            close(sigma * sigma, var, 1e-4) || var < 1e-12,
            "{tag} variance {} vs {var}",
            sigma * sigma
        );
        let noise = floats(&case["noise"]);
        let prev = floats(&case["prev_sample"]);
        for ((m, z), p) in mean.iter().zip(&noise).zip(&prev) {
            let ours = m + var.sqrt() * z;
            assert!(close(ours, *p, 5e-4), "{tag} prev_sample: {ours} vs {p}");
        }
    }
}

#[test]
fn ddim_steps_match_diffusers() {
    let v = vectors();
    let cases = v["ddim"].as_array().unwrap();
    assert!(!cases.is_empty());
    for case in cases {
        let t_train = case["T"].as_u64().unwrap() as usize;
        let steps = case["S"].as_u64().unwrap() as usize;
        let eta = case["eta"].as_f64().unwrap();
        let timesteps: Vec<usize> = floats(&case["timesteps"])
            .iter()
            .map(|&t| t as usize)
            .collect();
        assert_eq!(
            chain_timesteps(t_train, steps),
            timesteps,
            "leading spacing"
        );
        let (x0, mean, sigma) = our_step(case, SamplerKind::Ddim, steps, eta);
        let tag = format!(
            "{} T={t_train} S={steps} eta={eta} t={}",
            case["schedule"], case["t"]
        );
        for (a, b) in x0.iter().zip(floats(&case["pred_original_sample"])) {
            assert!(close(*a, b, 1e-4), "{tag} x0: {a} vs {b}");
        }
        let std = case["std_dev_t"].as_f64().unwrap();
        assert!(close(sigma, std, 1e-4), "{tag} sigma {sigma} vs {std}");
        let noise = floats(&case["noise"]);
        for ((m, z), p) in mean.iter().zip(&noise).zip(floats(&case["prev_sample"])) {
            let ours = m + std * z;
            assert!(close(ours, p, 1e-4), "{tag} prev_sample: {ours} vs {p}");
        }
    }
}
