//! Language conditioning end to end on a toy task whose state cannot tell what to do: a 1-D
//! point must leave [-1, 1] on the side its instruction ("go left" / "go right") names.
//! Behaviour cloning with text follows the instruction; the same policy told the opposite
//! fails, so the text is what it acts on. GRPO and PPO run on it unchanged, and PPO's critic
//! can read the instruction (and a camera) through the policy's condition.

use std::path::Path;

use diffrl_core::EnvError;
use diffrl_core::env::{Env, Info, StepResult};
use diffrl_core::episode::Episode;
use diffrl_core::reward::{Outcome, OutcomeReward};
use diffrl_core::seeding::rng;
use diffrl_core::space::{BoxSpace, ImageObs, ImageSpace, Observation, ObservationSpace};
use diffrl_core::vec_env::{AutoReset, VecEnv};
use diffrl_learn::bc::{self, BcConfig};
use diffrl_learn::data::{ChunkDataset, fit_normalizers, task_vocabulary};
use diffrl_learn::eval::evaluate;
use diffrl_learn::grpo::{self, Algorithm, CriticInput, GrpoConfig, GrpoHooks, GrpoLog, PpoConfig};
use diffrl_policy::config::{
    DenoiserConfig, DiffusionConfig, ImageEncoderConfig, ImageEncoderKind, PolicyConfig,
    TextEncoderConfig,
};
use diffrl_policy::{CpuAutodiff, CpuBackend, Policy, PolicySpec, SampleMode};
use rand::Rng as _;

const STEPS: usize = 10;
const LEFT: &str = "go left";
const RIGHT: &str = "Go right!";

/// x starts in [-0.2, 0.2]; an action a in [-1, 1] moves it by 0.25 a. The instruction is drawn
/// from the reset seed. Success: x > 1 for "go right", x < -1 for "go left" (terminates);
/// leaving on the other side ends the episode as a failure. With `swap`, the observations carry
/// the opposite instruction (success still follows the drawn one).
/// With `camera`, observations also carry an 8 x 8 image whose brightness is x (plus a ramp
/// across the columns).
#[derive(Clone, Default)]
struct GoTo {
    x: f32,
    t: usize,
    right: bool,
    swap: bool,
    camera: bool,
}

impl GoTo {
    fn instruction(&self) -> &'static str {
        if self.right != self.swap { RIGHT } else { LEFT }
    }
}

impl Env for GoTo {
    type Snapshot = (f32, usize, bool);
    fn observation_space(&self) -> ObservationSpace {
        ObservationSpace {
            state: Some(BoxSpace::uniform(&["x"], -2.0, 2.0)),
            image: self.camera.then_some(ImageSpace {
                height: 8,
                width: 8,
            }),
            text: true,
            agents: 1,
            entities: Vec::new(),
        }
    }
    fn action_space(&self) -> BoxSpace {
        BoxSpace::uniform(&["a"], -1.0, 1.0)
    }
    fn max_episode_steps(&self) -> usize {
        STEPS
    }
    fn reset(&mut self, seed: u64) -> Observation {
        let mut r = rng(seed);
        self.x = r.random_range(-0.2..0.2);
        self.right = r.random_bool(0.5);
        self.t = 0;
        self.observe()
    }
    fn step(&mut self, action: &[f32]) -> Result<StepResult, EnvError> {
        let mut a = action.to_vec();
        let clamped = self.action_space().check_and_clamp(&mut a)?;
        self.x += 0.25 * a[0];
        self.t += 1;
        let out = self.x.abs() > 1.0;
        let success = out && (self.x > 0.0) == self.right;
        let progress = if self.right { self.x } else { -self.x };
        Ok(StepResult {
            obs: self.observe(),
            reward: f32::from(u8::from(success)),
            terminated: out,
            truncated: !out && self.t >= STEPS,
            info: Info {
                metrics: Vec::new(),
                score: progress,
                success,
                clamped,
            },
        })
    }
    fn snapshot(&self) -> Self::Snapshot {
        (self.x, self.t, self.right)
    }
    fn restore(&mut self, s: &Self::Snapshot) -> Observation {
        (self.x, self.t, self.right) = *s;
        self.observe()
    }
    fn observe(&mut self) -> Observation {
        let level = ((self.x + 2.0) * 60.0).clamp(0.0, 255.0) as u8;
        Observation {
            text: Some(self.instruction().into()),
            image: self.camera.then(|| ImageObs {
                height: 8,
                width: 8,
                // A left-to-right ramp on top, so that a shifted frame differs.
                data: (0..8 * 8 * 3)
                    .map(|i| level.saturating_add((i / 3 % 8) as u8 * 8))
                    .collect(),
            }),
            ..Observation::state(vec![self.x])
        }
    }
    fn elapsed_steps(&self) -> usize {
        self.t
    }
}

/// Expert demonstrations: full speed towards the named side (a little noise), each episode's
/// instruction as its task.
fn demos(n: u64) -> Vec<Episode> {
    recorded(n, false)
}

/// [`demos`], or with `always_right` demonstrations that go right whatever they are told.
fn recorded(n: u64, always_right: bool) -> Vec<Episode> {
    let mut r = rng(5);
    let mut env = GoTo::default();
    (0..n)
        .map(|i| {
            let mut e = Episode::default();
            let mut obs = env.reset(1000 + i);
            e.task = obs.text.clone();
            let dir = if env.right || always_right { 1.0 } else { -1.0 };
            for _ in 0..STEPS {
                let a = vec![(dir * r.random_range(0.8..1.0f32)).clamp(-1.0, 1.0)];
                let s = env.step(&a).unwrap();
                e.push(obs, a, s.reward, s.info.score, s.info.success);
                obs = s.obs;
                if s.terminated {
                    break;
                }
            }
            e
        })
        .collect()
}

fn policy_config() -> PolicyConfig {
    PolicyConfig {
        obs_horizon: 1,
        pred_horizon: 2,
        action_horizon: 2,
        denoiser: DenoiserConfig {
            hidden: 32,
            blocks: 1,
            step_embed_dim: 8,
            ..DenoiserConfig::default()
        },
        diffusion: DiffusionConfig {
            train_steps: 20,
            denoising_steps: 5,
            ..DiffusionConfig::default()
        },
        encoder: diffrl_policy::config::EncoderConfig {
            text: TextEncoderConfig {
                max_tokens: 4,
                d_model: 16,
                heads: 2,
                layers: 1,
                ff_dim: 32,
                out_dim: 8,
            },
            ..Default::default()
        },
        ..PolicyConfig::default()
    }
}

fn pretrained(eps: &[Episode], dir: &Path) -> Policy<CpuBackend> {
    let norm = fit_normalizers(eps).unwrap();
    let spec = PolicySpec {
        text: true,
        ..PolicySpec::flat(1, 1)
    };
    let vocab = task_vocabulary(eps).unwrap();
    assert_eq!(vocab.tokens(), ["<pad>", "<unk>", "go", "left", "right"]);
    let device = Default::default();
    let policy =
        Policy::<CpuAutodiff>::with_text(policy_config(), spec, norm, vocab, 1, &device).unwrap();
    clone_behaviour(policy, eps, 600, dir)
}

/// Behaviour cloning of `policy` on `eps` for `steps` steps.
fn clone_behaviour(
    policy: Policy<CpuAutodiff>,
    eps: &[Episode],
    steps: usize,
    dir: &Path,
) -> Policy<CpuBackend> {
    let cfg = policy.config.clone();
    let data = ChunkDataset::build_with_text(
        eps,
        cfg.obs_horizon,
        cfg.pred_horizon,
        &policy.norm,
        policy.tokenizer(),
    )
    .unwrap();
    let bc_cfg = BcConfig {
        steps,
        batch_size: 64,
        lr: 3e-3,
        warmup_steps: 10,
        eval_every: 0,
        checkpoint_every: steps,
        log_every: 100,
        ema_decay: 0.9,
        ..BcConfig::default()
    };
    bc::train(policy, &data, &bc_cfg, 3, dir, false, &mut bc::NoHooks)
        .unwrap()
        .policy
}

/// Success rate over 32 seeded episodes (both instructions), instructions swapped or not.
fn success(policy: &Policy<CpuBackend>, swap: bool) -> f64 {
    let env = GoTo {
        swap,
        ..GoTo::default()
    };
    let mut v = VecEnv::new(vec![env; 8], AutoReset::SameStep, 1);
    evaluate(
        &mut v,
        policy,
        &Default::default(),
        32,
        77,
        SampleMode::Deterministic,
        &mut |_, _| {},
        &diffrl_core::record::NoRecorder,
    )
    .unwrap()
    .success_rate
}

#[test]
fn bc_with_text_follows_the_instruction_and_fails_when_it_is_swapped() {
    let d = tempfile::tempdir().unwrap();
    let eps = demos(40);
    let policy = pretrained(&eps, &d.path().join("bc"));
    let (told, swapped) = (success(&policy, false), success(&policy, true));
    eprintln!("go-to: success {told:.2} as told, {swapped:.2} told the opposite");
    assert!(told > 0.9 && swapped < 0.1, "{told:.2} / {swapped:.2}");
    // The checkpoint BC wrote reads the same instructions.
    let (saved, _) = diffrl_policy::checkpoint::load::<CpuBackend>(
        &d.path().join("bc/policy"),
        &Default::default(),
    )
    .unwrap();
    assert_eq!(success(&saved, false), told);

    // Fine-tuning replays the stored instructions when it recomputes chain log-likelihoods: one
    // iteration each of GRPO (groups share instruction and start) and PPO runs on text.
    let cfg = GrpoConfig {
        iterations: 1,
        groups: 2,
        group_size: 4,
        epochs: 1,
        minibatch: 64,
        ft_denoising_steps: 0,
        ..GrpoConfig::default()
    };
    let reward = OutcomeReward {
        outcome: Outcome::Score,
        success_bonus: 1.0,
        time_cost: 0.0,
    };
    for algorithm in [Algorithm::Grpo, Algorithm::Ppo] {
        let mut venv = VecEnv::new(vec![GoTo::default(); 8], AutoReset::SameStep, 1);
        let out = grpo::train(
            Policy::<CpuAutodiff>::trainable(&policy),
            &policy,
            &mut venv,
            &reward,
            &cfg,
            algorithm,
            11,
            &d.path().join(format!("{algorithm:?}")),
            false,
            &mut grpo::NoHooks,
        )
        .unwrap();
        assert!(out.policy.tokenizer().is_some(), "{algorithm:?}");
    }
}

#[test]
fn a_text_dataset_needs_every_task() {
    let mut eps = demos(4);
    eps[2].task = None;
    let e = task_vocabulary(&eps).unwrap_err().to_string();
    assert!(e.contains("episode 2 has no task instruction"), "{e}");
}

/// Keeps every iteration's log line.
struct Lines(Vec<GrpoLog>);
impl GrpoHooks<CpuBackend> for Lines {
    fn log(&mut self, line: &GrpoLog) {
        self.0.push(line.clone());
    }
}

/// PPO on GoTo ([`train_goto`]) from `policy`, its critic reading `input`, the actor all but
/// frozen (learning rate 1e-12) so that the returns stay those of `policy`: the critic's loss
/// per iteration.
fn ppo_value_losses(
    policy: &Policy<CpuBackend>,
    input: CriticInput,
    camera: bool,
    iterations: usize,
    dir: &Path,
) -> Vec<f64> {
    let cfg = GrpoConfig {
        iterations,
        groups: 2,
        group_size: 8,
        epochs: 4,
        minibatch: 40,
        ft_denoising_steps: 0,
        lr: 1e-12,
        ppo: PpoConfig {
            critic_lr: 3e-3,
            critic_hidden: 32,
            critic_input: input,
            ..PpoConfig::default()
        },
        ..GrpoConfig::default()
    };
    train_goto(policy, &cfg, Algorithm::Ppo, camera, 11, dir)
        .iter()
        .map(|l| l.value_loss)
        .collect()
}

/// `algorithm` with `cfg` on 16 GoTo environments (with `camera`, pixels too) from `policy`,
/// seed `seed`: every iteration's log line. Outcome: 1 on success, else 0.
fn train_goto(
    policy: &Policy<CpuBackend>,
    cfg: &GrpoConfig,
    algorithm: Algorithm,
    camera: bool,
    seed: u64,
    dir: &Path,
) -> Vec<GrpoLog> {
    let reward = OutcomeReward {
        outcome: Outcome::Success,
        success_bonus: 0.0,
        time_cost: 0.0,
    };
    let env = GoTo {
        camera,
        ..GoTo::default()
    };
    let mut venv = VecEnv::new(vec![env; 16], AutoReset::SameStep, 1);
    let mut lines = Lines(Vec::new());
    grpo::train(
        Policy::<CpuAutodiff>::trainable(policy),
        policy,
        &mut venv,
        &reward,
        cfg,
        algorithm,
        seed,
        dir,
        false,
        &mut lines,
    )
    .unwrap();
    lines.0
}

#[test]
fn a_critic_reading_the_policys_condition_learns_what_only_the_instruction_tells() {
    // A policy cloned from demonstrations that go right whatever they are told succeeds exactly
    // when told "go right": the return is the instruction's, and the state (x) cannot tell it.
    let d = tempfile::tempdir().unwrap();
    let policy = pretrained(&recorded(40, true), &d.path().join("bc"));
    let (right, left) = (success(&policy, false), success(&policy, true));
    assert!((right - left).abs() < 0.2, "{right:.2} / {left:.2}");
    let mean_last = |v: &[f64]| v[v.len() - 3..].iter().sum::<f64>() / 3.0;
    let state = ppo_value_losses(&policy, CriticInput::State, false, 12, &d.path().join("s"));
    let cond = ppo_value_losses(
        &policy,
        CriticInput::Condition,
        false,
        12,
        &d.path().join("c"),
    );
    let (state, cond) = (mean_last(&state), mean_last(&cond));
    eprintln!("critic loss over the last 3 iterations: state {state:.4}, condition {cond:.4}");
    // Returns are 0 or ~1 in equal parts: a state critic cannot beat their variance (~0.25).
    assert!(state > 0.15, "{state}");
    assert!(cond < 0.4 * state, "state {state}, condition {cond}");
}

#[test]
fn ppo_fine_tunes_a_pixel_and_text_policy_with_either_critic() {
    let d = tempfile::tempdir().unwrap();
    let policy = pixel_text_policy();
    for input in [CriticInput::State, CriticInput::Condition] {
        let losses = ppo_value_losses(
            &policy,
            input,
            true,
            1,
            &d.path().join(format!("{input:?}")),
        );
        assert!(
            losses.iter().all(|l| l.is_finite()),
            "{input:?}: {losses:?}"
        );
    }
}

#[test]
fn grpo_random_shift_recomputes_the_old_likelihoods_on_the_shifted_frames() {
    // The actor all but frozen, so both runs collect the same rollouts: the ratio starts at 1
    // with and without the shift, and only the shift changes the likelihoods the update sees.
    let d = tempfile::tempdir().unwrap();
    let policy = pixel_text_policy();
    let run = |shift: usize| {
        let cfg = GrpoConfig {
            iterations: 1,
            groups: 2,
            group_size: 8,
            epochs: 1,
            minibatch: 40,
            ft_denoising_steps: 0,
            lr: 1e-12,
            random_shift: shift,
            ..GrpoConfig::default()
        };
        let dir = d.path().join(shift.to_string());
        train_goto(&policy, &cfg, Algorithm::Grpo, true, 5, &dir).remove(0)
    };
    let (plain, shifted) = (run(0), run(2));
    assert_eq!(plain.success_rate, shifted.success_rate);
    assert_eq!(plain.reward_mean, shifted.reward_mean);
    for l in [&plain, &shifted] {
        assert!(
            (l.ratio_min - 1.0).abs() < 1e-4 && (l.ratio_max - 1.0).abs() < 1e-4,
            "ratio {} .. {}",
            l.ratio_min,
            l.ratio_max
        );
    }
    // The gradient is taken at the shifted frames.
    assert!(plain.grad_norm > 0.0);
    assert_ne!(plain.grad_norm, shifted.grad_norm);
}

/// A diffusion policy reading the instruction and GoTo's camera through the patch encoder.
fn pixel_text_policy() -> Policy<CpuBackend> {
    let eps = demos(8);
    let mut cfg = policy_config();
    cfg.encoder.image = ImageEncoderConfig {
        kind: ImageEncoderKind::Patches,
        out_dim: 4,
        patch_size: 4,
        patch_hidden: 8,
        token_dim: 4,
        ..ImageEncoderConfig::default()
    };
    let spec = PolicySpec {
        text: true,
        image: Some([3, 8, 8]),
        ..PolicySpec::flat(1, 1)
    };
    Policy::<CpuBackend>::with_text(
        cfg,
        spec,
        fit_normalizers(&eps).unwrap(),
        task_vocabulary(&eps).unwrap(),
        1,
        &Default::default(),
    )
    .unwrap()
}
