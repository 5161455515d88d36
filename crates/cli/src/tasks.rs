//! The tasks `diffrl` knows, by name. This is the one file of the CLI that names simulator
//! crates: adding a task is a crate under sims/ implementing `diffrl_core::task::Task`, one
//! line in [`builtin`] and its configs/<task>.toml (docs/adding-a-task.md). Every other file
//! reaches tasks through [`get`] and the config's type-erased `[env]` and `[expert]` tables.

use std::sync::{LazyLock, RwLock};

use diffrl_core::dyn_task::{DynTask, TaskRegistry};
use diffrl_core::task::Task;

/// The task of `diffrl run` without a config (its embedded configs/pusht.toml).
pub const DEFAULT_TASK: &str = "pusht";

/// The built-in tasks and their default run configs (embedded: `diffrl sim TASK` and
/// `diffrl demos TASK` without --config use them; `diffrl run` uses [`DEFAULT_TASK`]'s).
fn builtin(tasks: &mut Tasks) {
    tasks.add(
        diffrl_pusht::PushTTask,
        Some(DefaultConfig {
            origin: "configs/pusht.toml",
            text: include_str!("../../../configs/pusht.toml"),
        }),
    );
    for (task, origin, text) in [
        (
            diffrl_tabletop::task::TabletopTask::REACH_GOAL,
            "configs/reach-goal.toml",
            include_str!("../../../configs/reach-goal.toml"),
        ),
        (
            diffrl_tabletop::task::TabletopTask::PUSH_CUBE,
            "configs/push-cube.toml",
            include_str!("../../../configs/push-cube.toml"),
        ),
        (
            diffrl_tabletop::task::TabletopTask::PICK_CUBE,
            "configs/pick-cube.toml",
            include_str!("../../../configs/pick-cube.toml"),
        ),
        (
            diffrl_tabletop::task::TabletopTask::STACK_CUBE,
            "configs/stack-cube.toml",
            include_str!("../../../configs/stack-cube.toml"),
        ),
    ] {
        tasks.add(task, Some(DefaultConfig { origin, text }));
    }
    tasks.add(
        diffrl_tabletop::lang_cubes::LangCubesTask,
        Some(DefaultConfig {
            origin: "configs/lang-cubes.toml",
            text: include_str!("../../../configs/lang-cubes.toml"),
        }),
    );
    tasks.add(
        diffrl_drive::task::DriveTask::HIGHWAY_MERGE,
        Some(DefaultConfig {
            origin: "configs/highway-merge.toml",
            text: include_str!("../../../configs/highway-merge.toml"),
        }),
    );
    tasks.add(
        diffrl_drive::task::DriveTask::INTERSECTION,
        Some(DefaultConfig {
            origin: "configs/intersection.toml",
            text: include_str!("../../../configs/intersection.toml"),
        }),
    );
    tasks.add(
        diffrl_drive::task::DriveTask::ROUNDABOUT,
        Some(DefaultConfig {
            origin: "configs/roundabout.toml",
            text: include_str!("../../../configs/roundabout.toml"),
        }),
    );
    tasks.add(
        diffrl_drive::task::DriveTask::CUSTOM_ROAD,
        Some(DefaultConfig {
            origin: "configs/custom-road.toml",
            text: include_str!("../../../configs/custom-road.toml"),
        }),
    );
}

/// A task's embedded default run config.
#[derive(Debug, Clone, Copy)]
pub struct DefaultConfig {
    /// Where the text comes from, for error messages (`configs/pusht.toml`).
    pub origin: &'static str,
    /// The TOML text.
    pub text: &'static str,
}

#[derive(Default)]
struct Tasks {
    registry: TaskRegistry,
    configs: Vec<(&'static str, DefaultConfig)>,
}

impl Tasks {
    fn add<T: Task>(&mut self, task: T, config: Option<DefaultConfig>) -> &'static dyn DynTask {
        let t = self.registry.register(task);
        if let Some(c) = config
            && !self.configs.iter().any(|(n, _)| *n == t.name())
        {
            self.configs.push((t.name(), c));
        }
        t
    }
}

static TASKS: LazyLock<RwLock<Tasks>> = LazyLock::new(|| {
    let mut t = Tasks::default();
    builtin(&mut t);
    RwLock::new(t)
});

fn read() -> std::sync::RwLockReadGuard<'static, Tasks> {
    TASKS.read().unwrap_or_else(|e| e.into_inner())
}

/// Adds a task for the rest of the process (tests, programs embedding the CLI), with its
/// default run config if it has one (else configs naming it start from every section's
/// defaults). A task whose name is taken is not added; the registered one is returned.
pub fn register<T: Task>(task: T, default_config: Option<DefaultConfig>) -> &'static dyn DynTask {
    TASKS
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .add(task, default_config)
}

/// The task called `name`; the error lists the known ones.
pub fn get(name: &str) -> Result<&'static dyn DynTask, String> {
    let t = read();
    t.registry.get(name).ok_or_else(|| {
        format!(
            "unknown task {name:?}; available: {}",
            t.registry.names().join(", ")
        )
    })
}

/// The names of the known tasks.
pub fn names() -> Vec<&'static str> {
    read().registry.names()
}

/// The embedded default run config of task `name`, if it has one.
pub fn default_config(name: &str) -> Option<DefaultConfig> {
    read()
        .configs
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, c)| *c)
}

/// `[demos].dataset`'s default: the pusher's demonstrations with its default settings, shipped
/// in the repository.
pub const SHIPPED_DATASET: &str = "assets/pusht_pusher_200";

/// The datasets shipped in the repository that `diffrl run` records itself (with the config's
/// expert) when run from elsewhere: the default, and the embedded job's (push_max 40).
pub const SHIPPED_DATASETS: [&str; 2] = [SHIPPED_DATASET, "assets/pusht_pusher40_200"];
