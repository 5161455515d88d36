//! Noise schedules and the reverse-step coefficients of DDPM and DDIM (docs/algorithms.md §1).
//!
//! Everything here is plain f64 arithmetic, independent of Burn, so it can be checked against
//! `diffusers` directly. Timesteps follow diffusers: `t` in `0..T`, `abar[t]` is the cumulative
//! product up to and including `t`, and the step after `t = 0` has `abar_prev = 1`.

use serde::{Deserialize, Serialize};

/// Which beta schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ScheduleKind {
    /// `squaredcos_cap_v2` (Nichol & Dhariwal cosine, s = 0.008, betas <= 0.999).
    #[default]
    #[serde(alias = "squaredcos_cap_v2")]
    Cosine,
    /// Linear betas from 1e-4 to 0.02 (DDPM).
    Linear,
}

/// Betas and cumulative alphas of a schedule with `T` training steps.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    /// Per-step noise variances beta_t.
    pub betas: Vec<f64>,
    /// Cumulative products abar_t = prod_{i <= t} (1 - beta_i).
    pub alphas_cumprod: Vec<f64>,
}

impl Schedule {
    /// Builds the schedule with `train_steps` steps.
    pub fn new(kind: ScheduleKind, train_steps: usize) -> Self {
        let n = train_steps as f64;
        let betas: Vec<f64> = match kind {
            ScheduleKind::Cosine => {
                let f = |t: f64| {
                    ((t + 0.008) / 1.008 * std::f64::consts::FRAC_PI_2)
                        .cos()
                        .powi(2)
                };
                (0..train_steps)
                    .map(|i| {
                        let (t1, t2) = (i as f64 / n, (i + 1) as f64 / n);
                        (1.0 - f(t2) / f(t1)).min(0.999)
                    })
                    .collect()
            }
            ScheduleKind::Linear => {
                let (start, end) = (1e-4, 0.02);
                if train_steps == 1 {
                    vec![start]
                } else {
                    (0..train_steps)
                        .map(|i| start + (end - start) * i as f64 / (n - 1.0))
                        .collect()
                }
            }
        };
        let mut acc = 1.0;
        let alphas_cumprod = betas
            .iter()
            .map(|b| {
                acc *= 1.0 - b;
                acc
            })
            .collect();
        Self {
            betas,
            alphas_cumprod,
        }
    }

    /// Number of training steps T.
    pub fn len(&self) -> usize {
        self.betas.len()
    }

    /// Whether the schedule is empty (never, once built from a valid config).
    pub fn is_empty(&self) -> bool {
        self.betas.is_empty()
    }

    /// abar at timestep `t`, with `abar(-1) = 1`.
    pub fn abar(&self, t: i64) -> f64 {
        if t < 0 {
            1.0
        } else {
            self.alphas_cumprod[t as usize]
        }
    }
}

/// How the reverse chain steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum SamplerKind {
    /// DDIM over a leading-spaced subsequence of the training steps, with configurable eta.
    #[default]
    Ddim,
    /// DDPM over every training step (the chain length must equal the training steps).
    Ddpm,
}

/// What the denoiser's output estimates (diffusers' `prediction_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Prediction {
    /// The noise: x0_hat = (x - sqrt(1 - abar) out) / sqrt(abar); the loss is on the noise.
    #[default]
    Epsilon,
    /// The clean action chunk itself: x0_hat = out; the loss is on the chunk.
    Sample,
    /// The velocity v = sqrt(abar) eps - sqrt(1 - abar) x0 (Salimans & Ho 2022; diffusers'
    /// "v_prediction"): x0_hat = sqrt(abar) x - sqrt(1 - abar) out; the loss is on v.
    #[serde(rename = "v_prediction")]
    VPrediction,
}

impl Prediction {
    /// Whether this is the default (serialised configs leave it out then).
    pub fn is_epsilon(&self) -> bool {
        *self == Self::Epsilon
    }
}

/// Coefficients of one reverse step x_t -> x_prev, precomputed once.
///
/// With eps the network output (epsilon prediction):
/// x0_hat = clamp((x - sqrt(1 - abar) eps) / sqrt(abar), -c, c) (sample prediction:
/// x0_hat = clamp(out, -c, c); v prediction: clamp(sqrt(abar) x - sqrt(1 - abar) out, -c, c)) and
/// mu = c_x0 * x0_hat + c_xt * x. sigma is the kernel's own standard deviation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepCoeffs {
    /// Timestep fed to the network.
    pub t: usize,
    /// Timestep the step lands on (-1 = clean sample).
    pub prev_t: i64,
    /// sqrt(abar_t).
    pub sqrt_abar: f64,
    /// sqrt(1 - abar_t).
    pub sqrt_one_minus_abar: f64,
    /// Coefficient of the clamped x0 estimate in the mean.
    pub c_x0: f64,
    /// Coefficient of the current sample in the mean.
    pub c_xt: f64,
    /// Standard deviation of the reverse kernel.
    pub sigma: f64,
}

/// The timesteps of a K-step chain over T training steps, noisiest first.
///
/// DDIM uses diffusers' "leading" spacing (`t_s = s * (T / K)`); DDPM uses every step.
pub fn chain_timesteps(train_steps: usize, denoising_steps: usize) -> Vec<usize> {
    let ratio = train_steps / denoising_steps.max(1);
    (0..denoising_steps).rev().map(|s| s * ratio).collect()
}

/// Reverse-step coefficients for a chain of `denoising_steps` steps (noisiest first).
pub fn step_coeffs(
    schedule: &Schedule,
    sampler: SamplerKind,
    denoising_steps: usize,
    eta: f64,
) -> Vec<StepCoeffs> {
    let ts = chain_timesteps(schedule.len(), denoising_steps);
    let ratio = (schedule.len() / denoising_steps.max(1)) as i64;
    ts.iter()
        .map(|&t| {
            let a = schedule.abar(t as i64);
            let prev_t = (t as i64 - ratio).max(-1);
            let ap = schedule.abar(prev_t);
            let (sqrt_a, sqrt_1ma) = (a.sqrt(), (1.0 - a).sqrt());
            let (c_x0, c_xt, sigma) = match sampler {
                SamplerKind::Ddpm => {
                    let beta = 1.0 - a / ap;
                    let alpha = 1.0 - beta;
                    let var = (beta * (1.0 - ap) / (1.0 - a)).max(1e-20);
                    (
                        beta * ap.sqrt() / (1.0 - a),
                        (1.0 - ap) * alpha.sqrt() / (1.0 - a),
                        var.sqrt(),
                    )
                }
                SamplerKind::Ddim => {
                    let sigma = eta * ((1.0 - ap) / (1.0 - a) * (1.0 - a / ap)).max(0.0).sqrt();
                    // eps' = (x - sqrt(a) x0) / sqrt(1 - a); mu = sqrt(ap) x0 + d eps'.
                    let d = (1.0 - ap - sigma * sigma).max(0.0).sqrt();
                    (ap.sqrt() - d * sqrt_a / sqrt_1ma, d / sqrt_1ma, sigma)
                }
            };
            StepCoeffs {
                t,
                prev_t,
                sqrt_abar: sqrt_a,
                sqrt_one_minus_abar: sqrt_1ma,
                c_x0,
                c_xt,
                sigma,
            }
        })
        .collect()
}

/// Coefficients used in training: sqrt(abar_t) and sqrt(1 - abar_t) for every t.
pub fn q_sample_coeffs(schedule: &Schedule) -> (Vec<f64>, Vec<f64>) {
    schedule
        .alphas_cumprod
        .iter()
        .map(|a| (a.sqrt(), (1.0 - a).sqrt()))
        .unzip()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cosine_schedule_is_monotone_and_capped() {
        let s = Schedule::new(ScheduleKind::Cosine, 100);
        assert_eq!(s.len(), 100);
        assert!(s.betas.iter().all(|&b| b > 0.0 && b <= 0.999));
        assert!(s.alphas_cumprod.windows(2).all(|w| w[1] < w[0]));
        assert!(s.alphas_cumprod[99] < 1e-3);
    }

    #[test]
    fn leading_spacing_matches_diffusers() {
        assert_eq!(
            chain_timesteps(100, 10),
            vec![90, 80, 70, 60, 50, 40, 30, 20, 10, 0]
        );
        assert_eq!(chain_timesteps(20, 20), (0..20).rev().collect::<Vec<_>>());
    }

    #[test]
    fn ddim_eta_one_over_every_step_is_ddpm() {
        let s = Schedule::new(ScheduleKind::Cosine, 20);
        let ddpm = step_coeffs(&s, SamplerKind::Ddpm, 20, 0.0);
        let ddim = step_coeffs(&s, SamplerKind::Ddim, 20, 1.0);
        for (a, b) in ddpm.iter().zip(&ddim) {
            assert!((a.c_x0 - b.c_x0).abs() < 1e-9, "{a:?} {b:?}");
            assert!((a.c_xt - b.c_xt).abs() < 1e-9, "{a:?} {b:?}");
            assert!(
                (a.sigma - b.sigma).abs() < 1e-9 || a.prev_t < 0,
                "{a:?} {b:?}"
            );
        }
    }

    #[test]
    fn last_step_returns_the_clean_estimate() {
        let s = Schedule::new(ScheduleKind::Linear, 100);
        for sampler in [SamplerKind::Ddpm, SamplerKind::Ddim] {
            let k = if sampler == SamplerKind::Ddpm {
                100
            } else {
                10
            };
            let last = *step_coeffs(&s, sampler, k, 1.0).last().unwrap();
            assert_eq!(last.prev_t, -1);
            assert!(
                (last.c_x0 - 1.0).abs() < 1e-9 && last.c_xt.abs() < 1e-9,
                "{last:?}"
            );
            assert!(last.sigma < 1e-9);
        }
    }
}
