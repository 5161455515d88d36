//! Tasks held by name: the object-safe [`DynTask`] (implemented for every [`Task`]), the
//! type-erased `[env]` and `[expert]` tables of a config ([`EnvSection`], [`ExpertSection`]) and
//! the [`TaskRegistry`] a tool looks tasks up in.
//!
//! A config's `task = "NAME"` is the tag of a tagged union: it selects which task parses the
//! `[env]` and `[expert]` tables. A section keeps the task's typed settings and their TOML
//! table (the resolved settings, keys in the struct's order), so it can be written back into a
//! run folder, fingerprinted, compared and patched (`with_randomization`) without knowing its
//! type; the task validates every patch.

use std::any::Any;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::ConfigError;
use crate::config::{Invalid, Validate, from_toml_str};
use crate::dyn_env::{DynEnv, DynExpert};
use crate::seeding::Rng;
use crate::stages::StagePredicates;
use crate::task::{DatasetInfo, Section, Task};

type AnyConfig = Arc<dyn Any + Send + Sync>;

/// The object-safe face of a [`Task`], implemented for every one. Tools reach a task's settings
/// through [`EnvSection`] and [`ExpertSection`], which call the methods taking sections.
pub trait DynTask: Send + Sync + 'static {
    /// [`Task::name`].
    fn name(&self) -> &'static str;
    /// [`Task::dataset`].
    fn dataset(&self) -> DatasetInfo;
    /// [`Task::dataset_for`] of `env` (a section of this task).
    fn dataset_for(&self, env: &EnvSection) -> DatasetInfo;
    /// [`Task::render_state`].
    fn render_state(&self, state: &[f32], size: u32) -> Result<Vec<u8>, String>;
    /// [`Task::randomization_key`].
    fn randomization_key(&self) -> Option<&'static str>;
    /// [`Task::scripted_action`] on `env`, an environment this task built (None otherwise).
    fn scripted_action(&self, env: &DynEnv, rng: &mut Rng) -> Option<Vec<f32>>;

    /// The `[env]` and `[expert]` tables of the config document `text` (other keys are not
    /// looked at), parsed and validated; errors name `origin`, the key and its line.
    fn parse_sections(
        &'static self,
        text: &str,
        origin: &Path,
    ) -> Result<(EnvSection, ExpertSection), ConfigError>;
    /// An `[env]` table from a TOML value (omitted keys take their defaults).
    fn env_from_value(&'static self, value: toml::Value) -> Result<EnvSection, Invalid>;
    /// An `[expert]` table from a TOML value (omitted keys take their defaults).
    fn expert_from_value(&'static self, value: toml::Value) -> Result<ExpertSection, Invalid>;
    /// What a config without an `[env]` table gets.
    fn default_env(&'static self) -> EnvSection;
    /// What a config without an `[expert]` table gets.
    fn default_expert(&'static self) -> ExpertSection;

    /// A fresh environment of `env` (a section of this task).
    fn build_env(&self, env: &EnvSection) -> DynEnv;
    /// [`Task::observation`].
    fn observation(&self, env: &EnvSection) -> String;
    /// [`Task::observe_recorded`].
    fn observe_recorded(&self, env: &EnvSection, state: &[f32]) -> Result<Vec<f32>, String>;
    /// [`Task::privileged_recorded`].
    fn privileged_recorded(&self, env: &EnvSection, state: &[f32]) -> Result<Vec<f32>, String>;
    /// [`Task::image_size`].
    fn image_size(&self, env: &EnvSection) -> Option<u32>;
    /// [`Task::stages`].
    fn stages(&self, env: &EnvSection) -> Option<Box<dyn StagePredicates>>;
    /// [`Task::unobserved`].
    fn unobserved(&self, env: &EnvSection, fields: &[String]) -> Option<String>;
    /// [`Task::texts`].
    fn texts(&self, env: &EnvSection) -> Vec<String>;
    /// [`Task::expert`] of `expert` (a section of this task).
    fn build_expert(&self, expert: &ExpertSection, seed: u64) -> Option<DynExpert>;
    /// [`Task::expert_name`].
    fn expert_name(&self, expert: &ExpertSection) -> String;
}

/// `[env]` and `[expert]` of one task, read out of a whole config document.
#[derive(Deserialize)]
#[serde(bound = "")]
struct Sections<C: Section, X: Section> {
    #[serde(default)]
    env: C,
    #[serde(default)]
    expert: X,
}

impl<C: Section, X: Section> Validate for Sections<C, X> {
    fn validate(&self) -> Result<(), Invalid> {
        self.env.validate().map_err(|e| e.within("env"))?;
        self.expert.validate().map_err(|e| e.within("expert"))
    }
}

/// A section's typed settings and their table.
fn section<C: Section>(config: C) -> (AnyConfig, toml::Table) {
    let table = toml::Table::try_from(&config)
        .expect("a task's config table serialises to TOML (no None fields, string keys)");
    (Arc::new(config), table)
}

/// Typed settings from a TOML value, with the path of the offending key on error.
fn from_value<C: Section>(value: toml::Value) -> Result<C, Invalid> {
    let c: C = serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        Invalid::new(
            if path == "." { String::new() } else { path },
            e.into_inner().message().trim(),
        )
    })?;
    c.validate()?;
    Ok(c)
}

fn typed<'a, C: 'static>(config: &'a AnyConfig, task: &str) -> &'a C {
    config
        .downcast_ref::<C>()
        .unwrap_or_else(|| panic!("a config section of another task handed to task {task}"))
}

impl<T: Task> DynTask for T {
    fn name(&self) -> &'static str {
        Task::name(self)
    }
    fn dataset(&self) -> DatasetInfo {
        Task::dataset(self)
    }
    fn dataset_for(&self, env: &EnvSection) -> DatasetInfo {
        Task::dataset_for(self, typed(&env.config, Task::name(self)))
    }
    fn render_state(&self, state: &[f32], size: u32) -> Result<Vec<u8>, String> {
        Task::render_state(self, state, size)
    }
    fn randomization_key(&self) -> Option<&'static str> {
        Task::randomization_key(self)
    }
    fn scripted_action(&self, env: &DynEnv, rng: &mut Rng) -> Option<Vec<f32>> {
        Task::scripted_action(self, env.downcast_ref::<T::Env>()?, rng)
    }

    fn parse_sections(
        &'static self,
        text: &str,
        origin: &Path,
    ) -> Result<(EnvSection, ExpertSection), ConfigError> {
        let s: Sections<T::Config, T::ExpertConfig> = from_toml_str(text, origin)?;
        Ok((self.env_section(s.env), self.expert_section(s.expert)))
    }
    fn env_from_value(&'static self, value: toml::Value) -> Result<EnvSection, Invalid> {
        Ok(self.env_section(from_value::<T::Config>(value)?))
    }
    fn expert_from_value(&'static self, value: toml::Value) -> Result<ExpertSection, Invalid> {
        Ok(self.expert_section(from_value::<T::ExpertConfig>(value)?))
    }
    fn default_env(&'static self) -> EnvSection {
        self.env_section(T::Config::default())
    }
    fn default_expert(&'static self) -> ExpertSection {
        self.expert_section(T::ExpertConfig::default())
    }

    fn build_env(&self, env: &EnvSection) -> DynEnv {
        DynEnv::new(Task::build(self, typed(&env.config, Task::name(self))))
    }
    fn observation(&self, env: &EnvSection) -> String {
        Task::observation(self, typed(&env.config, Task::name(self)))
    }
    fn observe_recorded(&self, env: &EnvSection, state: &[f32]) -> Result<Vec<f32>, String> {
        Task::observe_recorded(self, typed(&env.config, Task::name(self)), state)
    }
    fn privileged_recorded(&self, env: &EnvSection, state: &[f32]) -> Result<Vec<f32>, String> {
        Task::privileged_recorded(self, typed(&env.config, Task::name(self)), state)
    }
    fn image_size(&self, env: &EnvSection) -> Option<u32> {
        Task::image_size(self, typed(&env.config, Task::name(self)))
    }
    fn stages(&self, env: &EnvSection) -> Option<Box<dyn StagePredicates>> {
        Task::stages(self, typed(&env.config, Task::name(self)))
    }
    fn unobserved(&self, env: &EnvSection, fields: &[String]) -> Option<String> {
        Task::unobserved(self, typed(&env.config, Task::name(self)), fields)
    }
    fn texts(&self, env: &EnvSection) -> Vec<String> {
        Task::texts(self, typed(&env.config, Task::name(self)))
    }
    fn build_expert(&self, expert: &ExpertSection, seed: u64) -> Option<DynExpert> {
        Task::expert(self, typed(&expert.config, Task::name(self)), seed).map(DynExpert::new)
    }
    fn expert_name(&self, expert: &ExpertSection) -> String {
        Task::expert_name(self, typed(&expert.config, Task::name(self)))
    }
}

/// Constructors of sections, for the blanket [`DynTask`] implementation.
trait SectionOf {
    fn env_section<C: Section>(&'static self, config: C) -> EnvSection;
    fn expert_section<C: Section>(&'static self, config: C) -> ExpertSection;
}

impl<T: Task> SectionOf for T {
    fn env_section<C: Section>(&'static self, config: C) -> EnvSection {
        let (config, table) = section(config);
        EnvSection {
            task: self,
            config,
            table,
        }
    }
    fn expert_section<C: Section>(&'static self, config: C) -> ExpertSection {
        let (config, table) = section(config);
        ExpertSection {
            task: self,
            config,
            table,
        }
    }
}

/// `base` with `patch` laid over it: tables merge key by key (recursively), any other value of
/// `patch` replaces the one in `base`.
pub fn merge_tables(base: &mut toml::Table, patch: &toml::Table) {
    for (k, v) in patch {
        match (base.get_mut(k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(p)) => merge_tables(b, p),
            _ => {
                base.insert(k.clone(), v.clone());
            }
        }
    }
}

/// What [`EnvSection`] and [`ExpertSection`] share: the task, the resolved table (every key,
/// defaults filled in), the typed settings; serialised as the table, equal when task and table
/// are.
macro_rules! section_common {
    ($name:ident) => {
        impl $name {
            /// The task whose table this is.
            pub fn task(&self) -> &'static dyn DynTask {
                self.task
            }

            /// The resolved settings (every key, defaults filled in).
            pub fn table(&self) -> &toml::Table {
                &self.table
            }

            /// The typed settings, if they are a `C`.
            pub fn get<C: 'static>(&self) -> Option<&C> {
                self.config.downcast_ref()
            }
        }

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                self.table.serialize(s)
            }
        }

        impl PartialEq for $name {
            fn eq(&self, other: &Self) -> bool {
                self.task.name() == other.task.name() && self.table == other.table
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($name))
                    .field("task", &self.task.name())
                    .field("table", &self.table)
                    .finish()
            }
        }
    };
}

/// A config's `[env]` table, parsed by its task.
#[derive(Clone)]
pub struct EnvSection {
    task: &'static dyn DynTask,
    config: AnyConfig,
    table: toml::Table,
}

impl EnvSection {
    /// A fresh environment.
    pub fn build(&self) -> DynEnv {
        self.task.build_env(self)
    }

    /// What the environment observes, in a word ([`Task::observation`]).
    pub fn observation(&self) -> String {
        self.task.observation(self)
    }

    /// The observation at a recorded state ([`Task::observe_recorded`]).
    pub fn observe_recorded(&self, state: &[f32]) -> Result<Vec<f32>, String> {
        self.task.observe_recorded(self, state)
    }

    /// The privileged values of a recorded state ([`Task::privileged_recorded`]).
    pub fn privileged_recorded(&self, state: &[f32]) -> Result<Vec<f32>, String> {
        self.task.privileged_recorded(self, state)
    }

    /// Side of the images the task draws ([`Task::image_size`]).
    pub fn image_size(&self) -> Option<u32> {
        self.task.image_size(self)
    }

    /// Every instruction text its observations can carry ([`Task::texts`]).
    pub fn texts(&self) -> Vec<String> {
        self.task.texts(self)
    }

    /// The stage predicates of this environment ([`Task::stages`]).
    pub fn stages(&self) -> Option<Box<dyn StagePredicates>> {
        self.task.stages(self)
    }

    /// How datasets store episodes of these settings ([`Task::dataset_for`]).
    pub fn dataset(&self) -> DatasetInfo {
        self.task.dataset_for(self)
    }

    /// These settings with `patch` laid over their table ([`merge_tables`]), checked by the
    /// task; an error names the key inside this table.
    pub fn patched(&self, patch: &toml::Table) -> Result<Self, Invalid> {
        let mut table = self.table.clone();
        merge_tables(&mut table, patch);
        self.task.env_from_value(toml::Value::Table(table))
    }

    /// The domain-randomisation table ([`Task::randomization_key`]), if the task has one.
    pub fn randomization(&self) -> Option<&toml::Table> {
        let key = self.task.randomization_key()?;
        self.table.get(key)?.as_table()
    }

    /// These settings with `patch` laid over the domain-randomisation table; an error names the
    /// key inside that table.
    pub fn with_randomization(&self, patch: &toml::Table) -> Result<Self, Invalid> {
        let Some(key) = self.task.randomization_key() else {
            return Err(Invalid::new(
                "",
                format!("task {} has no domain randomisation", self.task.name()),
            ));
        };
        let mut outer = toml::Table::new();
        outer.insert(key.to_string(), toml::Value::Table(patch.clone()));
        self.patched(&outer).map_err(|mut e| {
            let prefix = format!("{key}.");
            if let Some(rest) = e.field.strip_prefix(&prefix) {
                e.field = rest.to_string();
            } else if e.field == key {
                e.field.clear();
            }
            e
        })
    }

    /// Why changing only the randomisation `fields` cannot change what the policy sees
    /// ([`Task::unobserved`]).
    pub fn unobserved(&self, fields: &[String]) -> Option<String> {
        self.task.unobserved(self, fields)
    }
}

section_common!(EnvSection);

/// A config's `[expert]` table, parsed by its task.
#[derive(Clone)]
pub struct ExpertSection {
    task: &'static dyn DynTask,
    config: AnyConfig,
    table: toml::Table,
}

impl ExpertSection {
    /// The expert, seeded with `seed`; None when the task has none.
    pub fn build(&self, seed: u64) -> Option<DynExpert> {
        self.task.build_expert(self, seed)
    }

    /// The expert's name in reports.
    pub fn name(&self) -> String {
        self.task.expert_name(self)
    }

    /// These settings with `patch` laid over their table, checked by the task.
    pub fn patched(&self, patch: &toml::Table) -> Result<Self, Invalid> {
        let mut table = self.table.clone();
        merge_tables(&mut table, patch);
        self.task.expert_from_value(toml::Value::Table(table))
    }
}

section_common!(ExpertSection);

/// Tasks by name.
#[derive(Default)]
pub struct TaskRegistry {
    tasks: Vec<&'static dyn DynTask>,
}

impl TaskRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `task` (kept for the life of the process) and returns it; a task of the same name
    /// that is already registered stays, and is returned instead.
    pub fn register<T: Task>(&mut self, task: T) -> &'static dyn DynTask {
        if let Some(t) = self.get(Task::name(&task)) {
            return t;
        }
        let t: &'static T = Box::leak(Box::new(task));
        self.tasks.push(t);
        t
    }

    /// The task called `name`.
    pub fn get(&self, name: &str) -> Option<&'static dyn DynTask> {
        self.tasks.iter().copied().find(|t| t.name() == name)
    }

    /// Every task's name, in the order they were registered.
    pub fn names(&self) -> Vec<&'static str> {
        self.tasks.iter().map(|t| t.name()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_is_recursive_for_tables_only() {
        let mut base: toml::Table =
            toml::from_str("a = 1\nl = [1, 2]\n[t]\nx = 1\ny = 2\n").unwrap();
        let patch: toml::Table = toml::from_str("l = [3]\n[t]\ny = 5\nz = 6\n").unwrap();
        merge_tables(&mut base, &patch);
        let want: toml::Table =
            toml::from_str("a = 1\nl = [3]\n[t]\nx = 1\ny = 5\nz = 6\n").unwrap();
        assert_eq!(base, want);
    }
}
