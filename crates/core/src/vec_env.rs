//! N environments stepped in parallel (rayon over worlds, one world per environment).
//!
//! Autoreset follows gymnasium's two conventions:
//! - [`AutoReset::SameStep`]: an environment whose episode ends is reset inside the same
//!   `step`; the returned observation is the new episode's first one and the last observation
//!   of the finished episode is in [`VecStep::final_obs`].
//! - [`AutoReset::NextStep`]: the finished episode's last observation is returned; on the next
//!   `step` the environment ignores its action, resets, and returns the reset observation with
//!   reward 0 and both flags false.
//!
//! Episode `k` of environment `i` is seeded with `derive(derive(seed, i), k)`, so every
//! environment's stream of episodes is fixed by the vector's reset seed.

use rayon::prelude::*;

use crate::EnvError;
use crate::env::{Env, Info};
use crate::seeding::derive;
use crate::space::Observation;

/// When finished episodes restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AutoReset {
    /// Reset inside the step that ended the episode.
    #[default]
    SameStep,
    /// Reset on the following step (its action is ignored).
    NextStep,
    /// Never reset automatically; stepping a finished environment is an error.
    Disabled,
}

/// The batched outcome of [`VecEnv::step`].
#[derive(Debug, Clone)]
pub struct VecStep {
    /// Observation per environment (after autoreset, in same-step mode).
    pub obs: Vec<Observation>,
    /// Reward per environment.
    pub rewards: Vec<f32>,
    /// Terminated flags.
    pub terminated: Vec<bool>,
    /// Truncated flags.
    pub truncated: Vec<bool>,
    /// Step diagnostics.
    pub infos: Vec<Info>,
    /// Same-step mode: the final observation of episodes that ended at this step.
    pub final_obs: Vec<Option<Observation>>,
    /// Next-step mode: true where this step was a reset instead of a transition.
    pub was_reset: Vec<bool>,
}

struct Slot<E> {
    env: E,
    seed: u64,
    episode: u64,
    done: bool,
}

/// A vector of environments of one type, stepped in parallel.
pub struct VecEnv<E: Env> {
    slots: Vec<Slot<E>>,
    mode: AutoReset,
    pool: rayon::ThreadPool,
}

impl<E: Env> VecEnv<E> {
    /// Wraps `envs`, stepping them on `threads` worker threads (0 = one per core).
    pub fn new(envs: Vec<E>, mode: AutoReset, threads: usize) -> Self {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("diffrl-env-{i}"))
            .build()
            .expect("rayon thread pool (only fails if threads cannot be spawned)");
        let slots = envs
            .into_iter()
            .map(|env| Slot {
                env,
                seed: 0,
                episode: 0,
                done: true,
            })
            .collect();
        Self { slots, mode, pool }
    }

    /// Number of worker threads the environments step on.
    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// Number of environments.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether the vector is empty.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The environments, e.g. to read their spaces.
    pub fn envs(&self) -> impl Iterator<Item = &E> {
        self.slots.iter().map(|s| &s.env)
    }

    /// Resets every environment; environment `i` draws its episodes from `derive(seed, i)`.
    pub fn reset(&mut self, seed: u64) -> Vec<Observation> {
        let streams: Vec<u64> = (0..self.slots.len())
            .map(|i| derive(seed, i as u64))
            .collect();
        self.reset_streams(&streams)
    }

    /// Resets every environment; environment `i` draws its episodes from the seed stream
    /// `streams[i]` (its first episode from `derive(streams[i], 0)`, as [`VecEnv::reset`]). Two
    /// environments given the same stream start from the same state.
    ///
    /// # Panics
    /// When `streams` does not hold one seed per environment (a caller's bug).
    pub fn reset_streams(&mut self, streams: &[u64]) -> Vec<Observation> {
        assert_eq!(
            streams.len(),
            self.slots.len(),
            "reset_streams needs one seed per environment"
        );
        self.pool.install(|| {
            self.slots
                .par_iter_mut()
                .zip(streams)
                .map(|(s, &stream)| {
                    s.seed = stream;
                    s.episode = 0;
                    s.done = false;
                    s.env.reset(derive(s.seed, 0))
                })
                .collect()
        })
    }

    /// Resets only the environments where `mask` is true (each starts its next episode in its
    /// own seed stream) and returns their new observations (`None` elsewhere).
    pub fn reset_masked(&mut self, mask: &[bool]) -> Result<Vec<Option<Observation>>, EnvError> {
        if mask.len() != self.len() {
            return Err(EnvError::BatchSize {
                expected: self.len(),
                got: mask.len(),
            });
        }
        Ok(self.pool.install(|| {
            self.slots
                .par_iter_mut()
                .zip(mask)
                .map(|(s, &m)| m.then(|| Self::next_episode(s)))
                .collect()
        }))
    }

    /// Restores environment `i` from a snapshot (GRPO groups share an initial state this way).
    pub fn restore(&mut self, i: usize, snapshot: &E::Snapshot) -> Observation {
        let s = &mut self.slots[i];
        s.done = false;
        s.env.restore(snapshot)
    }

    /// Snapshot of environment `i`.
    pub fn snapshot(&self, i: usize) -> E::Snapshot {
        self.slots[i].env.snapshot()
    }

    fn next_episode(s: &mut Slot<E>) -> Observation {
        s.episode += 1;
        s.done = false;
        s.env.reset(derive(s.seed, s.episode))
    }

    /// Steps every environment with its action (`actions[i]` for environment `i`).
    pub fn step(&mut self, actions: &[Vec<f32>]) -> Result<VecStep, EnvError> {
        if actions.len() != self.len() {
            return Err(EnvError::BatchSize {
                expected: self.len(),
                got: actions.len(),
            });
        }
        let mode = self.mode;
        type One = (
            Observation,
            f32,
            bool,
            bool,
            Info,
            Option<Observation>,
            bool,
        );
        let results: Vec<Result<One, EnvError>> = self.pool.install(|| {
            self.slots
                .par_iter_mut()
                .zip(actions)
                .enumerate()
                .map(|(index, (s, a))| {
                    let wrap = |e: EnvError| EnvError::InVector {
                        index,
                        source: Box::new(e),
                    };
                    if s.done {
                        return match mode {
                            AutoReset::NextStep => Ok((
                                Self::next_episode(s),
                                0.0,
                                false,
                                false,
                                Info::default(),
                                None,
                                true,
                            )),
                            _ => Err(wrap(EnvError::EpisodeOver)),
                        };
                    }
                    let r = s.env.step(a).map_err(wrap)?;
                    let ended = r.terminated || r.truncated;
                    let (obs, final_obs) = match (mode, ended) {
                        (AutoReset::SameStep, true) => (Self::next_episode(s), Some(r.obs)),
                        (_, true) => {
                            s.done = true;
                            (r.obs, None)
                        }
                        (_, false) => (r.obs, None),
                    };
                    Ok((
                        obs,
                        r.reward,
                        r.terminated,
                        r.truncated,
                        r.info,
                        final_obs,
                        false,
                    ))
                })
                .collect()
        });
        let n = self.len();
        let mut out = VecStep {
            obs: Vec::with_capacity(n),
            rewards: Vec::with_capacity(n),
            terminated: Vec::with_capacity(n),
            truncated: Vec::with_capacity(n),
            infos: Vec::with_capacity(n),
            final_obs: Vec::with_capacity(n),
            was_reset: Vec::with_capacity(n),
        };
        for r in results {
            let (o, rew, te, tr, info, fo, wr) = r?;
            out.obs.push(o);
            out.rewards.push(rew);
            out.terminated.push(te);
            out.truncated.push(tr);
            out.infos.push(info);
            out.final_obs.push(fo);
            out.was_reset.push(wr);
        }
        Ok(out)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::space::{BoxSpace, ObservationSpace};

    /// A counter that terminates after `len` steps; its observation is [seed, t].
    #[derive(Clone)]
    pub struct Counter {
        pub len: usize,
        pub t: usize,
        pub seed: u64,
    }

    impl Env for Counter {
        type Snapshot = (usize, u64);
        fn observation_space(&self) -> ObservationSpace {
            ObservationSpace {
                state: Some(BoxSpace::uniform(&["seed", "t"], 0.0, 1e9)),
                image: None,
                text: false,
                agents: 1,
                entities: Vec::new(),
            }
        }
        fn action_space(&self) -> BoxSpace {
            BoxSpace::uniform(&["a"], -1.0, 1.0)
        }
        fn max_episode_steps(&self) -> usize {
            self.len
        }
        fn reset(&mut self, seed: u64) -> Observation {
            self.t = 0;
            self.seed = seed;
            self.observe()
        }
        fn step(&mut self, action: &[f32]) -> Result<StepResult, EnvError> {
            let mut a = action.to_vec();
            let clamped = self.action_space().check_and_clamp(&mut a)?;
            self.t += 1;
            Ok(StepResult {
                obs: self.observe(),
                reward: a[0],
                terminated: self.t >= self.len,
                truncated: false,
                info: Info {
                    clamped,
                    ..Info::default()
                },
            })
        }
        fn snapshot(&self) -> Self::Snapshot {
            (self.t, self.seed)
        }
        fn restore(&mut self, s: &Self::Snapshot) -> Observation {
            (self.t, self.seed) = *s;
            self.observe()
        }
        fn observe(&mut self) -> Observation {
            Observation::state(vec![(self.seed % 1000) as f32, self.t as f32])
        }
        fn elapsed_steps(&self) -> usize {
            self.t
        }
    }
    use crate::env::StepResult;

    fn counters(n: usize, mode: AutoReset) -> VecEnv<Counter> {
        VecEnv::new(
            (0..n)
                .map(|i| Counter {
                    len: 2 + i,
                    t: 0,
                    seed: 0,
                })
                .collect(),
            mode,
            2,
        )
    }

    #[test]
    fn same_step_autoreset_returns_final_obs() {
        let mut v = counters(2, AutoReset::SameStep);
        let o0 = v.reset(1);
        let a = vec![vec![0.5], vec![0.5]];
        let s1 = v.step(&a).unwrap();
        assert!(s1.final_obs.iter().all(Option::is_none));
        let s2 = v.step(&a).unwrap();
        assert!(s2.terminated[0] && !s2.terminated[1]);
        assert_eq!(s2.final_obs[0].as_ref().unwrap().state[1], 2.0);
        assert_eq!(s2.obs[0].state[1], 0.0, "env 0 restarted in the same step");
        assert_ne!(
            s2.obs[0].state[0], o0[0].state[0],
            "next episode has a new seed"
        );
    }

    #[test]
    fn next_step_autoreset_ignores_action() {
        let mut v = counters(1, AutoReset::NextStep);
        v.reset(3);
        v.step(&[vec![1.0]]).unwrap();
        let s = v.step(&[vec![1.0]]).unwrap();
        assert!(s.terminated[0] && s.obs[0].state[1] == 2.0);
        let r = v.step(&[vec![1.0]]).unwrap();
        assert!(
            r.was_reset[0] && r.rewards[0] == 0.0 && !r.terminated[0] && r.obs[0].state[1] == 0.0
        );
    }

    #[test]
    fn disabled_autoreset_errors_and_mask_resets() {
        let mut v = counters(2, AutoReset::Disabled);
        v.reset(0);
        v.step(&[vec![0.0], vec![0.0]]).unwrap();
        v.step(&[vec![0.0], vec![0.0]]).unwrap();
        let e = v.step(&[vec![0.0], vec![0.0]]).unwrap_err().to_string();
        assert!(e.contains("environment 0") && e.contains("reset"), "{e}");
        let r = v.reset_masked(&[true, false]).unwrap();
        assert!(r[0].is_some() && r[1].is_none());
        assert!(v.reset_masked(&[true]).is_err());
    }

    #[test]
    fn errors_name_the_environment_and_batch_size() {
        let mut v = counters(2, AutoReset::SameStep);
        v.reset(0);
        let e = v
            .step(&[vec![0.0], vec![f32::NAN]])
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("environment 1"), "{e}");
        assert!(v.step(&[vec![0.0]]).is_err());
    }

    #[test]
    fn same_seed_same_streams_across_thread_counts() {
        let run = |threads| {
            let mut v = VecEnv::new(
                (0..5)
                    .map(|_| Counter {
                        len: 3,
                        t: 0,
                        seed: 0,
                    })
                    .collect(),
                AutoReset::SameStep,
                threads,
            );
            let mut seen = vec![v.reset(42)];
            for _ in 0..7 {
                seen.push(v.step(&vec![vec![0.0]; 5]).unwrap().obs);
            }
            seen
        };
        assert_eq!(run(1), run(2));
    }
}
