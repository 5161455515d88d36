//! Type-erased environments and experts: any task's environment behind one type, so tools and
//! learners (generic over `E: Env`) can hold whichever task a config names without naming it.
//!
//! [`DynEnv`] forwards every call to the boxed environment; its snapshot is the environment's
//! own, behind an `Arc<dyn Any>`. The erasure adds a virtual call per method and nothing to the
//! environment's arithmetic: results are bit-identical to the concrete environment's.

use std::any::Any;
use std::sync::Arc;

use crate::env::{Env, StepResult};
use crate::error::EnvError;
use crate::scene::Scene;
use crate::space::{BoxSpace, Observation, ObservationSpace};
use crate::task::{Expert, TaskEnv};

/// A snapshot of a [`DynEnv`]: the concrete environment's snapshot, shared.
#[derive(Clone)]
pub struct DynSnapshot(Arc<dyn Any + Send + Sync>);

/// The object-safe face of a [`TaskEnv`] (implemented for every one).
trait ErasedEnv: Send {
    fn observation_space(&self) -> ObservationSpace;
    fn action_space(&self) -> BoxSpace;
    fn max_episode_steps(&self) -> usize;
    fn reset(&mut self, seed: u64) -> Observation;
    fn step(&mut self, action: &[f32]) -> Result<StepResult, EnvError>;
    fn snapshot(&self) -> DynSnapshot;
    fn restore(&mut self, snapshot: &DynSnapshot) -> Observation;
    fn observe(&mut self) -> Observation;
    fn elapsed_steps(&self) -> usize;
    fn scene(&self) -> Option<Scene>;
    fn anchor_cells(&self) -> Option<Vec<f32>>;
    fn true_state(&self) -> Vec<f64>;
    fn reset_to_state(&mut self, state: &[f64], seed: u64) -> Result<Observation, EnvError>;
    fn describe_step(&self, action: &[f32], result: &StepResult) -> String;
    fn named_state(&self) -> Vec<(&'static str, Vec<f64>)>;
    fn as_any(&self) -> &dyn Any;
}

impl<E: TaskEnv> ErasedEnv for E {
    fn observation_space(&self) -> ObservationSpace {
        Env::observation_space(self)
    }
    fn action_space(&self) -> BoxSpace {
        Env::action_space(self)
    }
    fn max_episode_steps(&self) -> usize {
        Env::max_episode_steps(self)
    }
    fn reset(&mut self, seed: u64) -> Observation {
        Env::reset(self, seed)
    }
    fn step(&mut self, action: &[f32]) -> Result<StepResult, EnvError> {
        Env::step(self, action)
    }
    fn snapshot(&self) -> DynSnapshot {
        DynSnapshot(Arc::new(Env::snapshot(self)))
    }
    fn restore(&mut self, snapshot: &DynSnapshot) -> Observation {
        let s = snapshot
            .0
            .downcast_ref::<E::Snapshot>()
            .expect("a snapshot restored into an environment of another task");
        Env::restore(self, s)
    }
    fn observe(&mut self) -> Observation {
        Env::observe(self)
    }
    fn elapsed_steps(&self) -> usize {
        Env::elapsed_steps(self)
    }
    fn scene(&self) -> Option<Scene> {
        Env::scene(self)
    }
    fn anchor_cells(&self) -> Option<Vec<f32>> {
        Env::anchor_cells(self)
    }
    fn true_state(&self) -> Vec<f64> {
        TaskEnv::true_state(self)
    }
    fn reset_to_state(&mut self, state: &[f64], seed: u64) -> Result<Observation, EnvError> {
        TaskEnv::reset_to_state(self, state, seed)
    }
    fn describe_step(&self, action: &[f32], result: &StepResult) -> String {
        TaskEnv::describe_step(self, action, result)
    }
    fn named_state(&self) -> Vec<(&'static str, Vec<f64>)> {
        TaskEnv::named_state(self)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Any task's environment.
pub struct DynEnv(Box<dyn ErasedEnv>);

impl DynEnv {
    /// Wraps a concrete environment.
    pub fn new<E: TaskEnv>(env: E) -> Self {
        Self(Box::new(env))
    }

    /// The concrete environment, if it is an `E`.
    pub fn downcast_ref<E: TaskEnv>(&self) -> Option<&E> {
        self.0.as_any().downcast_ref()
    }

    fn as_any(&self) -> &dyn Any {
        self.0.as_any()
    }
}

impl Env for DynEnv {
    type Snapshot = DynSnapshot;

    fn observation_space(&self) -> ObservationSpace {
        self.0.observation_space()
    }
    fn action_space(&self) -> BoxSpace {
        self.0.action_space()
    }
    fn max_episode_steps(&self) -> usize {
        self.0.max_episode_steps()
    }
    fn reset(&mut self, seed: u64) -> Observation {
        self.0.reset(seed)
    }
    fn step(&mut self, action: &[f32]) -> Result<StepResult, EnvError> {
        self.0.step(action)
    }
    fn snapshot(&self) -> DynSnapshot {
        self.0.snapshot()
    }
    fn restore(&mut self, snapshot: &DynSnapshot) -> Observation {
        self.0.restore(snapshot)
    }
    fn observe(&mut self) -> Observation {
        self.0.observe()
    }
    fn elapsed_steps(&self) -> usize {
        self.0.elapsed_steps()
    }
    fn scene(&self) -> Option<Scene> {
        self.0.scene()
    }
    fn anchor_cells(&self) -> Option<Vec<f32>> {
        self.0.anchor_cells()
    }
}

impl TaskEnv for DynEnv {
    fn true_state(&self) -> Vec<f64> {
        self.0.true_state()
    }
    fn reset_to_state(&mut self, state: &[f64], seed: u64) -> Result<Observation, EnvError> {
        self.0.reset_to_state(state, seed)
    }
    fn describe_step(&self, action: &[f32], result: &StepResult) -> String {
        self.0.describe_step(action, result)
    }
    fn named_state(&self) -> Vec<(&'static str, Vec<f64>)> {
        self.0.named_state()
    }
}

/// The object-safe face of an [`Expert`] for some concrete environment type.
trait ErasedExpert: Send {
    fn reset(&mut self, seed: u64);
    fn act(&mut self, env: &dyn Any) -> Vec<f32>;
}

struct Typed<E>(Box<dyn Expert<E>>);

impl<E: TaskEnv> ErasedExpert for Typed<E> {
    fn reset(&mut self, seed: u64) {
        self.0.reset(seed);
    }
    fn act(&mut self, env: &dyn Any) -> Vec<f32> {
        let env = env
            .downcast_ref::<E>()
            .expect("an expert asked to act in an environment of another task");
        self.0.act(env)
    }
}

/// Any task's expert, acting in that task's [`DynEnv`].
pub struct DynExpert(Box<dyn ErasedExpert>);

impl DynExpert {
    /// Wraps an expert for environments of type `E`.
    pub fn new<E: TaskEnv>(expert: Box<dyn Expert<E>>) -> Self {
        Self(Box::new(Typed(expert)))
    }
}

impl Expert<DynEnv> for DynExpert {
    fn reset(&mut self, seed: u64) {
        self.0.reset(seed);
    }
    /// # Panics
    /// If `env` belongs to another task than the expert.
    fn act(&mut self, env: &DynEnv) -> Vec<f32> {
        self.0.act(env.as_any())
    }
}

#[cfg(test)]
mod tests {
    use super::DynEnv;
    use crate::env::{Env, Info, StepResult};
    use crate::error::EnvError;
    use crate::scene::Scene;
    use crate::space::{BoxSpace, Observation, ObservationSpace};
    use crate::task::TaskEnv;

    /// Overrides every defaulted method of `Env` and `TaskEnv` with a value no default gives.
    struct Probe(usize);

    impl Env for Probe {
        type Snapshot = usize;
        fn observation_space(&self) -> ObservationSpace {
            ObservationSpace {
                state: Some(BoxSpace::uniform(&["x"], -1.0, 1.0)),
                image: None,
                text: false,
                agents: 1,
                entities: Vec::new(),
            }
        }
        fn action_space(&self) -> BoxSpace {
            BoxSpace::uniform(&["dx"], -1.0, 1.0)
        }
        fn max_episode_steps(&self) -> usize {
            7
        }
        fn reset(&mut self, _seed: u64) -> Observation {
            self.0 = 0;
            self.observe()
        }
        fn step(&mut self, _action: &[f32]) -> Result<StepResult, EnvError> {
            self.0 += 1;
            Ok(StepResult {
                obs: self.observe(),
                reward: 0.5,
                terminated: false,
                truncated: false,
                info: Info::default(),
            })
        }
        fn snapshot(&self) -> usize {
            self.0
        }
        fn restore(&mut self, snapshot: &usize) -> Observation {
            self.0 = *snapshot;
            self.observe()
        }
        fn observe(&mut self) -> Observation {
            Observation {
                state: vec![self.0 as f32],
                ..Observation::default()
            }
        }
        fn elapsed_steps(&self) -> usize {
            self.0
        }
        fn scene(&self) -> Option<Scene> {
            Some(Scene::new([[0.0, 0.0], [1.0, 1.0]], false))
        }
        fn anchor_cells(&self) -> Option<Vec<f32>> {
            Some(vec![0.25])
        }
    }

    impl TaskEnv for Probe {
        fn true_state(&self) -> Vec<f64> {
            vec![self.0 as f64]
        }
        fn reset_to_state(&mut self, state: &[f64], _seed: u64) -> Result<Observation, EnvError> {
            self.0 = state[0] as usize;
            Ok(self.observe())
        }
        fn describe_step(&self, _action: &[f32], _result: &StepResult) -> String {
            "probe".into()
        }
        fn named_state(&self) -> Vec<(&'static str, Vec<f64>)> {
            vec![("twice", vec![2.0 * self.0 as f64])]
        }
    }

    /// A forgotten forward would silently fall back to the trait's default.
    #[test]
    fn the_erased_env_forwards_every_defaulted_method() {
        let (mut plain, mut erased) = (Probe(0), DynEnv::new(Probe(0)));
        assert_eq!(erased.scene(), plain.scene());
        assert_eq!(erased.anchor_cells(), plain.anchor_cells());
        assert_eq!(
            erased.reset_to_state(&[3.0], 0).unwrap(),
            plain.reset_to_state(&[3.0], 0).unwrap()
        );
        let (a, b) = (erased.step(&[0.0]).unwrap(), plain.step(&[0.0]).unwrap());
        assert_eq!(a, b);
        assert_eq!(
            erased.describe_step(&[0.0], &a),
            plain.describe_step(&[0.0], &b)
        );
        assert_eq!(erased.named_state(), plain.named_state());
        let snap = erased.snapshot();
        erased.step(&[0.0]).unwrap();
        assert_eq!(erased.restore(&snap), plain.observe());
        assert_eq!(erased.downcast_ref::<Probe>().map(|p| p.0), Some(4));
        assert_eq!(erased.elapsed_steps(), 4);
    }
}
