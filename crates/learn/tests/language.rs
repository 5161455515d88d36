//! Language conditioning end to end on a toy task whose state cannot tell what to do: a 1-D
//! point must leave [-1, 1] on the side its instruction ("go left" / "go right") names.
//! Behaviour cloning with text follows the instruction; the same policy told the opposite
//! fails, so the text is what it acts on. GRPO and PPO run on it unchanged.

use std::path::Path;

use diffrl_core::EnvError;
use diffrl_core::env::{Env, Info, StepResult};
use diffrl_core::episode::Episode;
use diffrl_core::reward::{Outcome, OutcomeReward};
use diffrl_core::seeding::rng;
use diffrl_core::space::{BoxSpace, Observation, ObservationSpace};
use diffrl_core::vec_env::{AutoReset, VecEnv};
use diffrl_learn::bc::{self, BcConfig};
use diffrl_learn::data::{ChunkDataset, fit_normalizers, task_vocabulary};
use diffrl_learn::eval::evaluate;
use diffrl_learn::grpo::{self, Algorithm, GrpoConfig};
use diffrl_policy::config::{DenoiserConfig, DiffusionConfig, PolicyConfig, TextEncoderConfig};
use diffrl_policy::{CpuAutodiff, CpuBackend, Policy, PolicySpec, SampleMode};
use rand::Rng as _;

const STEPS: usize = 10;
const LEFT: &str = "go left";
const RIGHT: &str = "Go right!";

/// x starts in [-0.2, 0.2]; an action a in [-1, 1] moves it by 0.25 a. The instruction is drawn
/// from the reset seed. Success: x > 1 for "go right", x < -1 for "go left" (terminates);
/// leaving on the other side ends the episode as a failure. With `swap`, the observations carry
/// the opposite instruction (success still follows the drawn one).
#[derive(Clone, Default)]
struct GoTo {
    x: f32,
    t: usize,
    right: bool,
    swap: bool,
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
            image: None,
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
        Observation {
            text: Some(self.instruction().into()),
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
    let mut r = rng(5);
    let mut env = GoTo::default();
    (0..n)
        .map(|i| {
            let mut e = Episode::default();
            let mut obs = env.reset(1000 + i);
            e.task = obs.text.clone();
            let dir = if env.right { 1.0 } else { -1.0 };
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
    let cfg = policy_config();
    let device = Default::default();
    let policy =
        Policy::<CpuAutodiff>::with_text(cfg.clone(), spec, norm, vocab, 1, &device).unwrap();
    let data = ChunkDataset::build_with_text(
        eps,
        cfg.obs_horizon,
        cfg.pred_horizon,
        &policy.norm,
        policy.tokenizer(),
    )
    .unwrap();
    let bc_cfg = BcConfig {
        steps: 600,
        batch_size: 64,
        lr: 3e-3,
        warmup_steps: 10,
        eval_every: 0,
        checkpoint_every: 600,
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
