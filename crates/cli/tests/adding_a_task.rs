//! docs/adding-a-task.md, as a test: a toy task (a point mass on a line that has to stop at a
//! goal) registered only here, then driven through the CLI in-process like any built-in task:
//! `diffrl sim`, `diffrl demos`, `diffrl pretrain`, `diffrl eval` (plain and `--randomize`)
//! and the whole `diffrl run`.

use std::path::Path;

use diffrl_core::config::{Invalid, Validate, ensure};
use diffrl_core::scene::{Scene, Shape3d, Transform3d};
use diffrl_core::seeding::{self, Rng};
use diffrl_core::stages::StagePredicates;
use diffrl_core::task::{DatasetInfo, Expert, Task, TaskEnv};
use diffrl_core::{BoxSpace, Env, EnvError, Info, Observation, ObservationSpace, StepResult};
use rand::Rng as _;
use serde::{Deserialize, Serialize};

// ---- 1. The settings: the task's [env] and [expert] tables. --------------------------------

/// `[env]` of the reach task. `Default` is what an omitted table or key means.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReachConfig {
    /// Where the mass has to stop.
    pub goal: f64,
    /// Step limit.
    pub max_episode_steps: usize,
    /// Domain randomisation, drawn at every reset (robustness sweeps vary its fields).
    pub randomize: ReachRandomization,
}

/// `[env.randomize]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReachRandomization {
    /// Mass range `[lo, hi]`.
    pub mass: [f64; 2],
    /// Standard deviation of the noise on the observed position.
    pub obs_noise: f64,
}

impl Default for ReachConfig {
    fn default() -> Self {
        Self {
            goal: 0.5,
            max_episode_steps: 60,
            randomize: ReachRandomization::default(),
        }
    }
}

impl Default for ReachRandomization {
    fn default() -> Self {
        Self {
            mass: [1.0, 1.0],
            obs_noise: 0.0,
        }
    }
}

impl Validate for ReachConfig {
    fn validate(&self) -> Result<(), Invalid> {
        ensure(
            (-1.0..=1.0).contains(&self.goal),
            "goal",
            "must be in [-1, 1]",
        )?;
        ensure(
            self.max_episode_steps >= 1,
            "max_episode_steps",
            "must be at least 1",
        )?;
        let [lo, hi] = self.randomize.mass;
        ensure(
            lo > 0.0 && lo <= hi && hi.is_finite(),
            "randomize.mass",
            format!("must be a range [lo, hi] with 0 < lo <= hi, got [{lo}, {hi}]"),
        )?;
        ensure(
            self.randomize.obs_noise >= 0.0 && self.randomize.obs_noise.is_finite(),
            "randomize.obs_noise",
            "must be >= 0",
        )
    }
}

/// `[expert]` of the reach task: a PD controller.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReachExpertConfig {
    /// Force per unit of distance to the goal.
    pub kp: f64,
    /// Force per unit of velocity (damping).
    pub kv: f64,
}

impl Default for ReachExpertConfig {
    fn default() -> Self {
        Self { kp: 4.0, kv: 3.0 }
    }
}

impl Validate for ReachExpertConfig {
    fn validate(&self) -> Result<(), Invalid> {
        ensure(self.kp > 0.0, "kp", "must be > 0")?;
        ensure(self.kv >= 0.0, "kv", "must be >= 0")
    }
}

// ---- 2. The environment: core's Env, plus TaskEnv. -----------------------------------------

const DT: f64 = 0.1;

/// Everything needed to continue an episode exactly.
#[derive(Clone)]
pub struct ReachState {
    x: f64,
    v: f64,
    mass: f64,
    steps: usize,
    done: bool,
    rng: Rng,
}

/// A point mass on a line, pushed by a force in [-1, 1]; solved when it rests at the goal.
pub struct Reach {
    config: ReachConfig,
    s: ReachState,
}

impl Reach {
    pub fn new(config: ReachConfig) -> Self {
        let mut env = Self {
            config,
            s: ReachState {
                x: 0.0,
                v: 0.0,
                mass: 1.0,
                steps: 0,
                done: false,
                rng: seeding::rng(0),
            },
        };
        env.reset(0);
        env
    }

    fn start(&mut self, mut rng: Rng, x: f64, v: f64) -> Observation {
        let [lo, hi] = self.config.randomize.mass;
        let mass = if lo == hi {
            lo
        } else {
            rng.random_range(lo..=hi)
        };
        self.s = ReachState {
            x,
            v,
            mass,
            steps: 0,
            done: false,
            rng,
        };
        self.observe()
    }
}

impl Env for Reach {
    type Snapshot = ReachState;

    fn observation_space(&self) -> ObservationSpace {
        ObservationSpace {
            state: Some(BoxSpace {
                low: vec![-2.0, -5.0],
                high: vec![2.0, 5.0],
                names: vec!["x".into(), "v".into()],
            }),
            image: None,
            text: false,
            agents: 1,
            entities: Vec::new(),
        }
    }
    fn action_space(&self) -> BoxSpace {
        BoxSpace::uniform(&["force"], -1.0, 1.0)
    }
    fn max_episode_steps(&self) -> usize {
        self.config.max_episode_steps
    }
    fn reset(&mut self, seed: u64) -> Observation {
        let mut rng = seeding::rng(seed);
        let x = rng.random_range(-1.0..1.0);
        self.start(rng, x, 0.0)
    }
    fn step(&mut self, action: &[f32]) -> Result<StepResult, EnvError> {
        if self.s.done {
            return Err(EnvError::EpisodeOver);
        }
        let mut a = action.to_vec();
        let clamped = self.action_space().check_and_clamp(&mut a)?;
        self.s.v += f64::from(a[0]) / self.s.mass * DT;
        self.s.x += self.s.v * DT;
        self.s.steps += 1;
        let dist = (self.s.x - self.config.goal).abs();
        let success = dist < 0.05 && self.s.v.abs() < 0.2;
        let truncated = !success && self.s.steps >= self.config.max_episode_steps;
        self.s.done = success || truncated;
        let score = (1.0 - dist / 2.0).clamp(0.0, 1.0) as f32;
        Ok(StepResult {
            obs: self.observe(),
            reward: score,
            terminated: success,
            truncated,
            info: Info {
                metrics: Vec::new(),
                score,
                success,
                clamped,
            },
        })
    }
    fn snapshot(&self) -> ReachState {
        self.s.clone()
    }
    fn restore(&mut self, snapshot: &ReachState) -> Observation {
        self.s = snapshot.clone();
        self.observe()
    }
    fn observe(&mut self) -> Observation {
        let std = self.config.randomize.obs_noise;
        let noise = if std > 0.0 {
            std * rand_distr::Distribution::<f64>::sample(
                &rand_distr::StandardNormal,
                &mut self.s.rng,
            )
        } else {
            0.0
        };
        Observation::state(vec![(self.s.x + noise) as f32, self.s.v as f32])
    }
    fn elapsed_steps(&self) -> usize {
        self.s.steps
    }
    /// A 3-D scene: the mass as a sphere on the x axis, the goal as a thin box.
    fn scene(&self) -> Option<Scene> {
        let mut s = Scene::new_3d([[-2.0, -0.5, -0.5], [2.0, 0.5, 0.5]]);
        s.push_body(
            "goal",
            Shape3d::Box {
                half_extents: [0.05, 0.2, 0.01],
            },
            Transform3d::from_translation([self.config.goal as f32, 0.0, 0.0]),
            [144, 238, 144, 255],
        )
        .push_body(
            "mass",
            Shape3d::Sphere { radius: 0.05 },
            Transform3d::from_translation([self.s.x as f32, 0.0, 0.05]),
            [65, 105, 225, 255],
        );
        Some(s)
    }
}

impl TaskEnv for Reach {
    fn true_state(&self) -> Vec<f64> {
        vec![self.s.x, self.s.v]
    }
    fn reset_to_state(&mut self, state: &[f64], seed: u64) -> Result<Observation, EnvError> {
        let &[x, v] = state else {
            return Err(EnvError::InvalidState(format!(
                "needs 2 numbers x,v, got {}",
                state.len()
            )));
        };
        Ok(self.start(seeding::rng(seed), x, v))
    }
}

// ---- 3. The expert and the stages. ---------------------------------------------------------

/// Force = kp (goal - x) - kv v, clipped to the action bounds.
pub struct ReachExpert(ReachExpertConfig);

impl Expert<Reach> for ReachExpert {
    fn reset(&mut self, _seed: u64) {}
    fn act(&mut self, env: &Reach) -> Vec<f32> {
        let ReachExpertConfig { kp, kv } = self.0;
        let f = kp * (env.config.goal - env.s.x) - kv * env.s.v;
        vec![f.clamp(-1.0, 1.0) as f32]
    }
}

/// One stage: the mass is within 0.2 of the goal.
pub struct NearGoal(f64);

impl StagePredicates for NearGoal {
    fn names(&self) -> Vec<String> {
        vec!["near the goal".into()]
    }
    fn completed(&self, state: &[f32]) -> usize {
        usize::from((f64::from(state[0]) - self.0).abs() < 0.2)
    }
}

// ---- 4. The task: ties the pieces together under a name. -----------------------------------

/// The reach task.
pub struct ReachTask;

impl Task for ReachTask {
    type Config = ReachConfig;
    type ExpertConfig = ReachExpertConfig;
    type Env = Reach;

    fn name(&self) -> &'static str {
        "reach"
    }
    fn dataset(&self) -> DatasetInfo {
        DatasetInfo {
            fps: 10,
            robot_type: "1-D point mass".into(),
            state_names: vec!["x".into(), "v".into()],
            action_names: vec!["force".into()],
            instruction: "Move the mass to the goal and stop there.".into(),
        }
    }
    fn build(&self, config: &ReachConfig) -> Reach {
        Reach::new(config.clone())
    }
    fn randomization_key(&self) -> Option<&'static str> {
        Some("randomize")
    }
    fn expert(&self, config: &ReachExpertConfig, _seed: u64) -> Option<Box<dyn Expert<Reach>>> {
        Some(Box::new(ReachExpert(config.clone())))
    }
    fn expert_name(&self, _config: &ReachExpertConfig) -> String {
        "PD".into()
    }
    fn stages(&self, config: &ReachConfig) -> Option<Box<dyn StagePredicates>> {
        Some(Box::new(NearGoal(config.goal)))
    }
}

// ---- 5. Registered (here: in the test process), it is a task like Push-T. ------------------

fn cli(args: &[&str]) -> Result<String, String> {
    diffrl_cli::tasks::register(ReachTask, None);
    let mut out = Vec::new();
    let full = std::iter::once("diffrl").chain(args.iter().copied());
    diffrl_cli::run_cli(full, &mut out).map_err(|e| format!("{e:#}"))?;
    Ok(String::from_utf8(out).unwrap())
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

/// A small config for the reach task: tiny policy, short training, few episodes.
fn config(dir: &Path) -> String {
    write(
        dir,
        "reach.toml",
        "task = \"reach\"\n\
         [run]\nthreads = 1\n\
         [env]\nmax_episode_steps = 40\n\
         [demos]\nepisodes = 20\nnoise_px = 0.1\n\
         [policy]\npred_horizon = 4\naction_horizon = 2\n\
         [policy.denoiser]\nhidden = 32\nblocks = 1\n\
         [policy.diffusion]\ntrain_steps = 8\ndenoising_steps = 4\n\
         [pretrain]\nsteps = 200\nbatch_size = 32\nwarmup_steps = 10\nlog_every = 100\neval_every = 0\ncheckpoint_every = 200\n\
         [eval]\nepisodes = 6\nenvs = 2\n\
         [reward.progress]\nsteps = 20\nbatch_size = 32\nhidden = [16]\ncontext = 1\n\
         [grpo]\niterations = 1\ngroups = 2\ngroup_size = 2\nepochs = 1\nminibatch = 64\nft_denoising_steps = 2\n",
    )
}

#[test]
fn sim_runs_the_expert_and_replays_actions() {
    let lines = cli(&["sim", "reach", "--seed", "3", "--expert", "--json"]).unwrap();
    let steps: Vec<serde_json::Value> = lines
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(steps[0]["state"].as_array().unwrap().len(), 2);
    let last = steps.last().unwrap();
    assert_eq!(last["success"], true, "{last}");
    // The same start, given as a state, and the same forces replay the same states.
    let x0 = steps[0]["state"][0].as_f64().unwrap();
    let d = tempfile::tempdir().unwrap();
    let forces: Vec<Vec<f64>> = steps[1..]
        .iter()
        .map(|s| vec![s["action"][0].as_f64().unwrap()])
        .collect();
    let acts = write(d.path(), "a.json", &serde_json::to_string(&forces).unwrap());
    let init = format!("{x0},0");
    let replay = cli(&[
        "sim",
        "reach",
        "--init-state",
        &init,
        "--actions",
        &acts,
        "--json",
    ])
    .unwrap();
    assert_eq!(replay, lines);
    let e = cli(&["sim", "reach", "--init-state", "1,2,3", "--expert"]).unwrap_err();
    assert!(e.contains("needs 2 numbers"), "{e}");
    // The task validates its own tables.
    let bad = write(
        d.path(),
        "bad.toml",
        "task = \"reach\"\n[env]\ngoal = 3.0\n",
    );
    let e = cli(&["sim", "reach", "--seed", "0", "--expert", "--config", &bad]).unwrap_err();
    assert!(e.contains("env.goal: must be in [-1, 1]"), "{e}");
    let reach = write(d.path(), "reach.toml", "task = \"reach\"\n");
    let e = cli(&[
        "sim", "pusht", "--seed", "0", "--expert", "--config", &reach,
    ])
    .unwrap_err();
    assert!(e.contains("for task \"reach\""), "{e}");
}

#[test]
fn demos_pretrain_eval_and_a_robustness_sweep() {
    let d = tempfile::tempdir().unwrap();
    let cfg = config(d.path());
    let demos = d.path().join("demos").display().to_string();
    let msg = cli(&[
        "demos",
        "reach",
        "--config",
        &cfg,
        "--episodes",
        "20",
        "--seed",
        "0",
        "--out",
        &demos,
        "--threads",
        "1",
    ])
    .unwrap();
    assert!(msg.contains("20 episodes: success 100.0%"), "{msg}");
    let info: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(d.path().join("demos/meta/info.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(info["robot_type"], "1-D point mass");
    let bc = d.path().join("bc").display().to_string();
    let text = cli(&[
        "pretrain",
        "--config",
        &cfg,
        "--dataset",
        &demos,
        "--out",
        &bc,
    ])
    .unwrap();
    assert!(text.contains("eval: success"), "{text}");
    let policy = d.path().join("bc/policy").display().to_string();
    let eval = d.path().join("eval.json").display().to_string();
    cli(&[
        "eval", "--policy", &policy, "--config", &cfg, "--out", &eval,
    ])
    .unwrap();
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&eval).unwrap()).unwrap();
    assert_eq!(report["episodes"], 6);
    // A sweep over the task's own randomisation table: no field list in the CLI.
    let sweep = write(
        d.path(),
        "sweep.toml",
        "episodes = 2\n[grid]\nmass = [[3.0, 3.0]]\n\
         [[setting]]\nname = \"noisy\"\nrandomize = { obs_noise = 0.1 }\n",
    );
    let run = d.path().join("rob");
    std::fs::create_dir_all(&run).unwrap();
    let out = run.display().to_string();
    cli(&[
        "eval",
        "--policy",
        &policy,
        "--config",
        &cfg,
        "--randomize",
        &sweep,
        "--out",
        &out,
    ])
    .unwrap();
    let table: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("robustness.json")).unwrap())
            .unwrap();
    let names: Vec<&str> = table["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["nominal", "mass = [3.0, 3.0]", "noisy"]);
    assert_eq!(
        table["rows"][1]["randomize"]["mass"],
        serde_json::json!([3.0, 3.0])
    );
    let bad = write(d.path(), "bad.toml", "[grid]\nfriction = [[1.0, 1.0]]\n");
    let e = cli(&[
        "eval",
        "--policy",
        &policy,
        "--config",
        &cfg,
        "--randomize",
        &bad,
        "--out",
        &out,
    ])
    .unwrap_err();
    assert!(
        e.contains("unknown field `friction`") && e.contains("`mass`"),
        "{e}"
    );
}

#[test]
fn the_whole_run() {
    let d = tempfile::tempdir().unwrap();
    let cfg = config(d.path());
    let out = d.path().join("run").display().to_string();
    let log = cli(&["--rerun", "off", "run", &cfg, "--out", &out]).unwrap();
    for stage in [
        "[1/5] demos",
        "[2/5] pretrain",
        "[3/5] reward",
        "[4/5] grpo",
        "[5/5] eval",
    ] {
        assert!(log.contains(stage), "{stage} missing from:\n{log}");
    }
    assert!(log.contains("20 expert episodes (PD expert"), "{log}");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.path().join("run/summary.json")).unwrap())
            .unwrap();
    assert_eq!(summary["grpo"]["episodes"], 6);
    let written = std::fs::read_to_string(d.path().join("run/config.toml")).unwrap();
    assert!(written.starts_with("task = \"reach\""), "{written}");
    assert!(written.contains("[env.randomize]"), "{written}");
}
