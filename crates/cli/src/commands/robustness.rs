//! `diffrl eval --randomize SWEEP.toml`: how a policy holds up when the simulator's physics and
//! observations move away from the ones it was trained on (sim-to-real robustness).
//!
//! A sweep file lists patches of the task's own domain-randomisation table (Push-T:
//! `[env.randomize]`) around the nominal one of the run config: one grid axis at a time
//! (`[grid]`) and named settings (`[[setting]]`). The task validates every patched table, so the
//! sweep knows no field of any task. Every setting plays the same seeded episodes (same initial
//! states), so settings differ only in physics and observations, and the nominal row equals a
//! plain `diffrl eval` with the same seed and episode count. The results form a
//! [`RobustnessTable`], written as `robustness.json` and `robustness.md` and as a
//! `## Robustness` section of `report.md`.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use burn::tensor::backend::{AutodiffBackend, Backend};
use diffrl_core::ConfigError;
use diffrl_core::config::{Invalid, Validate, ensure};
use diffrl_core::dyn_task::EnvSection;
use diffrl_core::fs::write_atomic;
use diffrl_core::record::{Level, Recorder};
use diffrl_learn::LearnError;
use diffrl_learn::eval::{EvalReport, MetricSummary, evaluate};
use diffrl_policy::{Policy, SampleMode};
use diffrl_viz::paths;
use serde::{Deserialize, Serialize};

use crate::commands::eval::EvalArgs;
use crate::config::{self, RunConfig};
use crate::envs::{load_policy, vec_env};
use crate::progress::bar;

/// The machine-readable table, written next to the policy's evaluation.
pub const JSON_FILE: &str = "robustness.json";
/// The Markdown table.
pub const MARKDOWN_FILE: &str = "robustness.md";
/// The run report that receives (or has replaced) its `## Robustness` section.
pub const REPORT_FILE: &str = "report.md";
/// The heading of the section in `report.md`.
const SECTION: &str = "## Robustness";

/// A sweep file (`diffrl eval --randomize FILE.toml`; the Push-T default grid is
/// `configs/pusht_randomize.toml`). Unknown keys are errors: here, and (checked by the task)
/// inside the patches.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepFile {
    /// Episodes per setting (`--episodes` overrides it; default: `[eval].episodes`).
    #[serde(default)]
    pub episodes: Option<usize>,
    /// Root seed of every setting's episodes, the same for all settings so that they start
    /// from the same states (`--seed` overrides it; default: `[eval].seed`).
    #[serde(default)]
    pub seed: Option<u64>,
    /// One axis at a time around the nominal randomisation: each key is a field of the task's
    /// randomisation table, its value an array of values of that field; each value is a setting
    /// named like `friction = [0.5, 0.5]`, with every other field nominal. Settings appear in
    /// the order of the task's fields, then in the order of the values.
    #[serde(default)]
    pub grid: toml::Table,
    /// Named settings (`[[setting]]`), after the grid's.
    #[serde(default, rename = "setting")]
    pub settings: Vec<NamedSetting>,
}

/// `[[setting]]`: a named setting.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamedSetting {
    /// Row label, unique within the sweep (`nominal` is taken).
    pub name: String,
    /// The fields that differ from the nominal randomisation, e.g.
    /// `{ friction = [0.0, 1.0], action_delay = [0, 3] }`; the rest stay nominal.
    #[serde(default)]
    pub randomize: toml::Table,
}

/// A setting ready to run.
#[derive(Debug, Clone, PartialEq)]
pub struct Setting {
    /// Row label.
    pub name: String,
    /// Where it comes from: `nominal`, `grid.friction[1]`, `setting[0]`.
    pub origin: String,
    /// The randomisation the episodes use (the task's whole table).
    pub randomize: toml::Table,
    /// The fields the sweep sets (empty for the nominal row), in the task's order.
    pub fields: Vec<String>,
    /// The environment settings the episodes use.
    pub env: EnvSection,
}

impl Setting {
    fn new(name: String, origin: String, env: EnvSection, fields: Vec<String>) -> Self {
        Self {
            name,
            origin,
            randomize: env.randomization().cloned().unwrap_or_default(),
            fields,
            env,
        }
    }

    /// Why this setting cannot change what the policy observes, if it cannot: every field it
    /// sets only affects another observation mode (the task decides).
    pub fn irrelevant(&self) -> Option<String> {
        self.env.unobserved(&self.fields)
    }
}

impl SweepFile {
    /// The settings to evaluate, nominal first, each patched into `nominal` and checked by its
    /// task; errors name the grid value or setting (`grid.friction[1]`).
    pub fn expand(&self, nominal: &EnvSection) -> Result<Vec<Setting>, Invalid> {
        let task = nominal.task().name();
        let base = nominal.randomization().ok_or_else(|| {
            Invalid::new("grid", format!("task {task} has no domain randomisation"))
        })?;
        let known = || {
            base.keys()
                .map(|k| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        if let Some(k) = self.grid.keys().find(|k| !base.contains_key(*k)) {
            return Err(Invalid::new(
                "grid",
                format!(
                    "unknown field `{k}` of task {task}'s randomisation, expected one of {}",
                    known()
                ),
            ));
        }
        let mut settings = vec![Setting::new(
            "nominal".into(),
            "nominal".into(),
            nominal.clone(),
            Vec::new(),
        )];
        for field in base.keys() {
            let Some(values) = self.grid.get(field) else {
                continue;
            };
            let values = values.as_array().ok_or_else(|| {
                Invalid::new(
                    format!("grid.{field}"),
                    "must be an array of values, one setting each",
                )
            })?;
            for (index, v) in values.iter().enumerate() {
                let origin = format!("grid.{field}[{index}]");
                let mut patch = toml::Table::new();
                patch.insert(field.clone(), v.clone());
                let env = nominal
                    .with_randomization(&patch)
                    .map_err(|i| Invalid::new(origin.clone(), i.message))?;
                // The value as the task read it (`[1, 1]` for a float range reads [1.0, 1.0]).
                let resolved = env.randomization().and_then(|r| r.get(field)).unwrap_or(v);
                let name = format!("{field} = {resolved}");
                if let Some(first) = settings.iter().find(|s| s.name == name) {
                    return Err(Invalid::new(
                        origin,
                        format!("repeats {} ({name})", first.origin),
                    ));
                }
                settings.push(Setting::new(name, origin, env, vec![field.clone()]));
            }
        }
        for (i, s) in self.settings.iter().enumerate() {
            let origin = format!("setting[{i}]");
            ensure(
                !s.name.trim().is_empty(),
                &format!("{origin}.name"),
                "must not be empty",
            )?;
            if let Some(first) = settings.iter().find(|x| x.name == s.name) {
                return Err(Invalid::new(
                    format!("{origin}.name"),
                    format!("{:?} is already the name of {}", s.name, first.origin),
                ));
            }
            let env = nominal.with_randomization(&s.randomize).map_err(|e| {
                let field = if e.field.is_empty() {
                    format!("{origin}.randomize")
                } else {
                    format!("{origin}.randomize.{}", e.field)
                };
                Invalid::new(field, format!("{} (setting {:?})", e.message, s.name))
            })?;
            let fields = base
                .keys()
                .filter(|k| s.randomize.contains_key(*k))
                .cloned()
                .collect();
            settings.push(Setting::new(s.name.clone(), origin, env, fields));
        }
        ensure(
            settings.len() > 1,
            "grid",
            "the sweep defines no settings besides the nominal one: add [grid] axes or \
             [[setting]] tables",
        )?;
        Ok(settings)
    }
}

impl Validate for SweepFile {
    /// Checks what needs no task; the settings are checked by [`SweepFile::expand`] against
    /// the run config's task.
    fn validate(&self) -> Result<(), Invalid> {
        ensure(self.episodes != Some(0), "episodes", "must be at least 1")
    }
}

/// One evaluated setting.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RobustnessRow {
    /// Row label.
    pub name: String,
    /// Where it comes from in the sweep file (`nominal`, `grid.kp[0]`, `setting[2]`).
    pub origin: String,
    /// The randomisation used (the task's whole table).
    pub randomize: toml::Table,
    /// Episodes played.
    pub episodes: usize,
    /// Successful episodes.
    pub successes: usize,
    /// successes / episodes.
    pub success_rate: f64,
    /// Wilson 95% interval of the success rate.
    pub ci95: [f64; 2],
    /// Mean over episodes of the highest score.
    pub mean_max_score: f64,
    /// Mean episode length.
    pub mean_length: f64,
    /// success_rate minus the nominal row's.
    pub delta_success_rate: f64,
    /// mean_max_score minus the nominal row's.
    pub delta_mean_max_score: f64,
    /// The task's episode metrics (driving: collision and off-road rates, ADE, ...), as the
    /// evaluation reports them; empty for tasks without any.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metrics: BTreeMap<String, MetricSummary>,
}

/// A setting that was not run, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SkippedSetting {
    /// Row label.
    pub name: String,
    /// Where it comes from in the sweep file.
    pub origin: String,
    /// Why it was skipped.
    pub reason: String,
}

/// The robustness table: what `robustness.json` holds (and what a viewer would log).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RobustnessTable {
    /// Policy checkpoint folder.
    pub policy: PathBuf,
    /// The sweep file.
    pub sweep: PathBuf,
    /// The run config (`None`: the embedded configs/pusht.toml).
    pub config: Option<PathBuf>,
    /// What the policy observes ([env], in the task's word).
    pub obs: String,
    /// The table the settings patch (`env.randomize`), for the report.
    #[serde(skip)]
    pub randomization: String,
    /// Episodes per setting.
    pub episodes: usize,
    /// Root seed shared by every setting.
    pub seed: u64,
    /// Environments stepped in parallel (with seed and episodes, fixes the episodes played).
    pub envs: usize,
    /// Stochastic chains instead of deterministic DDIM.
    pub stochastic: bool,
    /// Wall time of all settings, in seconds.
    pub seconds: f64,
    /// Evaluated settings, nominal first.
    pub rows: Vec<RobustnessRow>,
    /// Settings not run for this policy.
    pub skipped: Vec<SkippedSetting>,
}

impl RobustnessTable {
    /// Rows from settings and their reports; deltas against the first (nominal) row.
    fn rows(settings: &[Setting], reports: &[EvalReport]) -> Vec<RobustnessRow> {
        let (s0, m0) = reports
            .first()
            .map_or((0.0, 0.0), |r| (r.success_rate, r.mean_max_score));
        settings
            .iter()
            .zip(reports)
            .map(|(s, r)| RobustnessRow {
                name: s.name.clone(),
                origin: s.origin.clone(),
                randomize: s.randomize.clone(),
                episodes: r.episodes,
                successes: r.successes,
                success_rate: r.success_rate,
                ci95: r.ci95,
                mean_max_score: r.mean_max_score,
                mean_length: r.mean_length,
                delta_success_rate: r.success_rate - s0,
                delta_mean_max_score: r.mean_max_score - m0,
                metrics: r.metrics.clone(),
            })
            .collect()
    }

    /// The Markdown table alone: setting | success | 95% CI | mean max score | Δ vs nominal,
    /// then one column per task metric (the mean) when the task reports any.
    pub fn markdown_table(&self) -> String {
        let names: BTreeSet<&str> = self
            .rows
            .iter()
            .flat_map(|r| r.metrics.keys().map(String::as_str))
            .collect();
        let mut t = String::from(
            "| setting | success | 95% CI | mean max score | Δ vs nominal (success, score) |",
        );
        for n in &names {
            t.push_str(&format!(" {n} |"));
        }
        t.push_str("\n|---|---|---|---|---|");
        t.push_str(&"---|".repeat(names.len()));
        t.push('\n');
        for (i, r) in self.rows.iter().enumerate() {
            let delta = if i == 0 {
                "-".to_string()
            } else {
                format!(
                    "{:+.1} pp, {:+.3}",
                    rounded(100.0 * r.delta_success_rate, 1),
                    rounded(r.delta_mean_max_score, 3)
                )
            };
            t.push_str(&format!(
                "| {} | {:.1}% ({}/{}) | {:.1}-{:.1}% | {:.3} | {delta} |",
                r.name.replace('|', "\\|"),
                100.0 * r.success_rate,
                r.successes,
                r.episodes,
                100.0 * r.ci95[0],
                100.0 * r.ci95[1],
                r.mean_max_score,
            ));
            for n in &names {
                let cell = r
                    .metrics
                    .get(*n)
                    .map_or("-".into(), MetricSummary::mean_text);
                t.push_str(&format!(" {cell} |"));
            }
            t.push('\n');
        }
        t
    }

    /// The section body shared by `robustness.md` and `report.md`: settings, table, skips.
    pub fn markdown_body(&self) -> String {
        let config = self.config.as_ref().map_or_else(
            || {
                let origin = crate::tasks::default_config(crate::tasks::DEFAULT_TASK)
                    .map_or("default config", |c| c.origin);
                format!("the embedded `{origin}`")
            },
            |p| format!("`{}`", p.display()),
        );
        let mut s = format!(
            "Policy `{}` under the settings of `{}` around the nominal `[{}]` of \
             {config}: {} episodes per setting, root seed {}, {} environments, {} chains. Every \
             setting starts from the same states. Success with Wilson 95% intervals; Δ in \
             percentage points of success and in mean max score. Wall time {:.0} s.\n\n",
            self.policy.display(),
            self.sweep.display(),
            self.randomization,
            self.episodes,
            self.seed,
            self.envs,
            if self.stochastic {
                "stochastic"
            } else {
                "deterministic DDIM"
            },
            self.seconds,
        );
        s.push_str(&self.markdown_table());
        if !self.skipped.is_empty() {
            s.push_str("\nSkipped:\n\n");
            for k in &self.skipped {
                s.push_str(&format!("- {} (`{}`): {}\n", k.name, k.origin, k.reason));
            }
        }
        s
    }

    /// `robustness.md`.
    pub fn markdown(&self) -> String {
        format!("# Robustness\n\n{}", self.markdown_body())
    }
}

/// `x` rounded to `decimals`, without a negative zero (so a tiny loss prints as +0.000).
fn rounded(x: f64, decimals: i32) -> f64 {
    let scale = 10f64.powi(decimals);
    (x * scale).round() / scale + 0.0
}

/// `doc` with its `## Robustness` section (up to the next `#` or `##` heading) replaced by
/// `body`, or with the section appended when there is none.
pub fn upsert_section(doc: &str, body: &str) -> String {
    let section = format!("{SECTION}\n\n{}", body.trim_end());
    let lines: Vec<&str> = doc.lines().collect();
    let is_top = |l: &str| l.starts_with("# ") || l.starts_with("## ");
    match lines.iter().position(|l| l.trim_end() == SECTION) {
        Some(start) => {
            let end = lines[start + 1..]
                .iter()
                .position(|l| is_top(l))
                .map_or(lines.len(), |k| start + 1 + k);
            let mut out = lines[..start].join("\n");
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(&section);
            out.push('\n');
            if end < lines.len() {
                out.push('\n');
                out.push_str(&lines[end..].join("\n"));
                out.push('\n');
            }
            out
        }
        None if doc.trim().is_empty() => format!("# diffrl report\n\n{section}\n"),
        None => format!("{}\n\n{section}\n", doc.trim_end()),
    }
}

/// Plays every setting on `episodes` seeded episodes, with one progress bar over all of them.
fn run_settings<B: Backend>(
    cfg: &RunConfig,
    policy: &Policy<B>,
    device: &B::Device,
    settings: &[Setting],
    episodes: usize,
    seed: u64,
    mode: SampleMode,
) -> Result<Vec<EvalReport>, LearnError> {
    let pb = bar(
        (settings.len() * episodes) as u64,
        "  robustness [{bar:30}] {pos}/{len} episodes {elapsed_precise} (eta {eta}) {msg}",
    );
    let mut reports = Vec::with_capacity(settings.len());
    for (k, s) in settings.iter().enumerate() {
        pb.set_message(s.name.clone());
        let mut setting_cfg = cfg.clone();
        setting_cfg.env = s.env.clone();
        // As run_eval builds it, so the nominal row equals `diffrl eval`.
        let mut venv = vec_env(&setting_cfg, cfg.eval.envs.min(episodes.max(1)));
        let done = (k * episodes) as u64;
        let report = evaluate(
            &mut venv,
            policy,
            device,
            episodes,
            seed,
            mode,
            &mut |d, _| pb.set_position(done + d as u64),
            &diffrl_core::record::NoRecorder,
        )?;
        pb.println(format!(
            "  {}: success {:.1}%, mean max score {:.3}",
            s.name,
            100.0 * report.success_rate,
            report.mean_max_score
        ));
        reports.push(report);
    }
    pb.finish_and_clear();
    Ok(reports)
}

/// `diffrl eval --randomize SWEEP.toml`.
pub fn robustness_cmd(
    args: &EvalArgs,
    sweep_path: &Path,
    rerun: Option<&diffrl_viz::RerunSink>,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let (mut cfg, _) = config::load(args.config.as_deref())?;
    // --action-delay moves the nominal setting, as it moves a plain `diffrl eval`.
    if let Some(d) = args.action_delay {
        config::set_action_delay(&mut cfg, d)?;
    }
    let sweep: SweepFile = diffrl_core::config::load(sweep_path)?;
    let all = sweep.expand(&cfg.env).map_err(|i| ConfigError::Invalid {
        path: sweep_path.to_path_buf(),
        field: i.field,
        message: i.message,
    })?;
    let episodes = args
        .episodes
        .or(sweep.episodes)
        .unwrap_or(cfg.eval.episodes);
    anyhow::ensure!(episodes >= 1, "--episodes must be at least 1");
    let seed = args.seed.or(sweep.seed).unwrap_or(cfg.eval.seed);
    let mode = if args.stochastic {
        SampleMode::Stochastic
    } else {
        SampleMode::Deterministic
    };
    let obs = cfg.env.observation();
    let mut settings = Vec::new();
    let mut skipped = Vec::new();
    for s in all {
        match s.irrelevant() {
            Some(reason) => skipped.push(SkippedSetting {
                name: s.name,
                origin: s.origin,
                reason,
            }),
            None => settings.push(s),
        }
    }
    let dir = args.out.clone().unwrap_or_else(|| {
        args.policy_dir()
            .parent()
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
    });
    writeln!(
        out,
        "robustness: {} settings x {episodes} episodes (seed {seed}){}",
        settings.len(),
        if skipped.is_empty() {
            String::new()
        } else {
            format!(", {} skipped", skipped.len())
        }
    )?;
    for k in &skipped {
        writeln!(out, "  skipping {} ({}): {}", k.name, k.origin, k.reason)?;
    }
    let recording = crate::viz::Recording::open(
        rerun,
        diffrl_viz::RerunSink::Off,
        "eval --randomize",
        diffrl_core::record::Timeline::EnvStep,
        out,
    )?;
    let t0 = Instant::now();
    let reports = with_device!(args.device, |device, B| {
        let policy =
            load_policy::<<B as AutodiffBackend>::InnerBackend>(&cfg, args.policy_dir(), &device)?;
        run_settings(&cfg, &policy, &device, &settings, episodes, seed, mode)
            .map_err(anyhow::Error::from)
    })?;
    let table = RobustnessTable {
        policy: args.policy_dir().to_path_buf(),
        sweep: sweep_path.to_path_buf(),
        config: args.config.clone(),
        obs,
        randomization: format!("env.{}", cfg.env.task().randomization_key().unwrap_or("")),
        episodes,
        seed,
        envs: cfg.eval.envs.min(episodes),
        stochastic: args.stochastic,
        seconds: t0.elapsed().as_secs_f64(),
        rows: RobustnessTable::rows(&settings, &reports),
        skipped,
    };
    write_table(&dir, &table)?;
    record_robustness(recording.recorder(), &table);
    write!(out, "{}", table.markdown_table())?;
    writeln!(
        out,
        "robustness: {:.1} s; wrote {}, {} and {}",
        table.seconds,
        dir.join(JSON_FILE).display(),
        dir.join(MARKDOWN_FILE).display(),
        dir.join(REPORT_FILE).display()
    )?;
    Ok(())
}

/// Writes robustness.json, robustness.md and the report section into `dir`, each atomically.
pub fn write_table(dir: &Path, table: &RobustnessTable) -> anyhow::Result<()> {
    let write = |name: &str, bytes: &[u8]| {
        let p = dir.join(name);
        write_atomic(&p, bytes).with_context(|| format!("writing {}", p.display()))
    };
    write(JSON_FILE, &serde_json::to_vec_pretty(table)?)?;
    write(MARKDOWN_FILE, table.markdown().as_bytes())?;
    let report = dir.join(REPORT_FILE);
    let old = match std::fs::read_to_string(&report) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", report.display())),
    };
    write(
        REPORT_FILE,
        upsert_section(&old, &table.markdown_body()).as_bytes(),
    )
}

/// Logs a robustness table: the Markdown table (settings numbered in bar order) and one bar
/// per setting for success rate and mean max score.
pub fn record_robustness(rec: &dyn Recorder, table: &RobustnessTable) {
    if !rec.enabled() {
        return;
    }
    let mut doc = table.markdown();
    doc.push_str("\n\nBars, left to right:\n\n");
    for (i, r) in table.rows.iter().enumerate() {
        doc.push_str(&format!("{i}. {}\n", r.name));
    }
    rec.document(paths::ROBUSTNESS_TABLE, &doc);
    let col = |f: fn(&RobustnessRow) -> f64| -> Vec<f64> { table.rows.iter().map(f).collect() };
    rec.bar_chart(paths::ROBUSTNESS_SUCCESS, &col(|r| r.success_rate));
    rec.bar_chart(paths::ROBUSTNESS_SCORE, &col(|r| r.mean_max_score));
    for (i, r) in table.rows.iter().enumerate() {
        rec.text(
            paths::RUN_LOG,
            Level::Info,
            &format!(
                "robustness {i} {}: success {:.1}% ({}/{}), mean max score {:.3}",
                r.name,
                100.0 * r.success_rate,
                r.successes,
                r.episodes,
                r.mean_max_score
            ),
        );
    }
    rec.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sweep file `text`, parsed and expanded around `nominal`; errors as the command
    /// reports them (`configs/x.toml: grid.kp[0]: ...`).
    fn expand(text: &str, nominal: &EnvSection) -> Result<Vec<Setting>, ConfigError> {
        let origin = Path::new("configs/x.toml");
        let sweep: SweepFile = diffrl_core::config::from_toml_str(text, origin)?;
        sweep.expand(nominal).map_err(|i| ConfigError::Invalid {
            path: origin.to_path_buf(),
            field: i.field,
            message: i.message,
        })
    }

    /// The embedded default config's environment (Push-T, through the registry), with `patch`
    /// (TOML text) laid over its randomisation.
    fn nominal(patch: &str) -> EnvSection {
        let (cfg, _) = config::load(None).unwrap();
        cfg.env
            .with_randomization(&toml::from_str(patch).unwrap())
            .unwrap()
    }

    /// `env` observing `obs`.
    fn observing(env: &EnvSection, obs: &str) -> EnvSection {
        env.patched(&toml::from_str(&format!("obs = {obs:?}")).unwrap())
            .unwrap()
    }

    fn names(s: &[Setting]) -> Vec<&str> {
        s.iter().map(|s| s.name.as_str()).collect()
    }

    #[test]
    fn shipped_default_grid_parses_and_expands() {
        let text = include_str!("../../../../configs/pusht_randomize.toml");
        let state = observing(&nominal(""), "state");
        let settings = expand(text, &state).unwrap();
        assert_eq!(settings[0].name, "nominal");
        assert!(settings.len() > 10, "{:?}", names(&settings));
        assert!(names(&settings).contains(&"action_delay = [4, 4]"));
        // A state policy skips only the image settings.
        let skipped_state: Vec<_> = settings
            .iter()
            .filter(|s| s.irrelevant().is_some())
            .collect();
        assert!(!skipped_state.is_empty());
        assert!(
            skipped_state
                .iter()
                .all(|s| s.fields == ["image_tint"] && s.origin.starts_with("grid.image_tint"))
        );
    }

    /// The driving sweep expands around highway-merge's shipped config, every row a valid
    /// randomisation of it (reaction times included).
    #[test]
    fn shipped_driving_grid_parses_and_expands() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/highway-merge.toml");
        let (cfg, _) = config::load(Some(&path)).unwrap();
        let text = include_str!("../../../../configs/highway-merge_randomize.toml");
        let settings = expand(text, &cfg.env).unwrap();
        assert_eq!(settings[0].name, "nominal");
        for name in [
            "reaction_delay = [1.0, 1.0]",
            "density = [1.5, 1.5]",
            "everything randomised (moderate)",
        ] {
            assert!(names(&settings).contains(&name), "{:?}", names(&settings));
        }
        assert!(settings.iter().all(|s| s.irrelevant().is_none()));
    }

    #[test]
    fn grid_expands_one_axis_at_a_time_around_nominal() {
        let text = "episodes = 3\nseed = 7\n[grid]\nfriction = [[0.0, 0.0], [0.5, 1.0]]\n\
             action_delay = [[2, 2]]\nobs_noise_px = [2.0]\n\
             [[setting]]\nname = \"rough and late\"\n\
             randomize = { action_delay = [0, 3], friction = [0.0, 1.0] }\n";
        let sweep: SweepFile = toml::from_str(text).unwrap();
        assert_eq!((sweep.episodes, sweep.seed), (Some(3), Some(7)));
        let nominal = nominal("kp = [80.0, 80.0]");
        let s = expand(text, &nominal).unwrap();
        assert_eq!(
            names(&s),
            [
                "nominal",
                "friction = [0.0, 0.0]",
                "friction = [0.5, 1.0]",
                "action_delay = [2, 2]",
                "obs_noise_px = 2.0",
                "rough and late"
            ]
        );
        assert_eq!(s[0].env, nominal);
        let with = |patch: &str| {
            nominal
                .with_randomization(&toml::from_str(patch).unwrap())
                .unwrap()
        };
        assert_eq!(s[2].env, with("friction = [0.5, 1.0]"));
        assert_eq!(&s[2].randomize, s[2].env.randomization().unwrap());
        assert_eq!(s[2].randomize["kp"], nominal.randomization().unwrap()["kp"]);
        assert_eq!(s[2].origin, "grid.friction[1]");
        assert_eq!(
            s[5].env,
            with("friction = [0.0, 1.0]\naction_delay = [0, 3]")
        );
        // Fields in the task's order, whatever the file's.
        assert_eq!(s[5].fields, ["friction", "action_delay"]);
        assert_eq!(s[5].origin, "setting[0]");
        // A value is named as the task read it.
        let s = expand("[grid]\nfriction = [[1, 1]]\n", &nominal).unwrap();
        assert_eq!(s[1].name, "friction = [1.0, 1.0]");
    }

    #[test]
    fn errors_name_the_file_the_setting_and_the_field() {
        let err = |text: &str| expand(text, &nominal("")).unwrap_err().to_string();
        let e = err("[grid]\nfriction = [[0.0, 0.0], [1.0, 0.5]]\n");
        assert_eq!(
            e,
            "configs/x.toml: grid.friction[1]: must be a range [lo, hi] with 0 <= lo <= hi, \
             got [1.0, 0.5]"
        );
        let e = err("[grid]\nkp = [[0.0, 10.0]]\n");
        assert!(
            e.starts_with("configs/x.toml: grid.kp[0]: must be a range"),
            "{e}"
        );
        let e = err("[grid]\naction_delay = [[3, 11]]\n");
        assert!(
            e.contains("grid.action_delay[0]") && e.contains("<= 10"),
            "{e}"
        );
        let e = err("[grid]\nobs_noise_rad = [-0.1]\n");
        assert!(e.contains("grid.obs_noise_rad[0]: must be >= 0"), "{e}");
        let e = err(
            "[[setting]]\nname = \"a\"\nrandomize = { kv = [1.0, 2.0] }\n\
             [[setting]]\nname = \"b\"\nrandomize = { block_mass = [0.0, 1.0] }\n",
        );
        assert!(
            e.starts_with("configs/x.toml: setting[1].randomize.block_mass: must be a range")
                && e.contains("(setting \"b\")"),
            "{e}"
        );
        // Unknown keys, wherever they are, are named.
        let e = err("[grid]\nfriction = [[0.5, 0.5]]\nfrction = [[0.5, 0.5]]\n");
        assert!(e.contains("grid") && e.contains("frction"), "{e}");
        let e = err("[[setting]]\nname = \"a\"\nrandomize = { frction = [0.5, 0.5] }\n");
        assert!(
            e.contains("setting[0].randomize") && e.contains("frction"),
            "{e}"
        );
        let e = err("episode = 3\n[grid]\nkp = [[90.0, 90.0]]\n");
        assert!(e.contains("episode"), "{e}");
        // A scalar where a range belongs is a type error at that key.
        let e = err("[grid]\nfriction = [0.5]\n");
        assert!(e.contains("grid.friction"), "{e}");
        let e = err("[grid]\nfriction = 0.5\n");
        assert!(e.contains("grid.friction: must be an array"), "{e}");
        // Names, counts and emptiness.
        let e = err("episodes = 0\n[grid]\nkp = [[90.0, 90.0]]\n");
        assert!(e.ends_with("episodes: must be at least 1"), "{e}");
        let e = err("[grid]\nkp = [[90.0, 90.0], [90.0, 90.0]]\n");
        assert!(e.contains("grid.kp[1]: repeats grid.kp[0]"), "{e}");
        let e = err("[[setting]]\nname = \"nominal\"\nrandomize = { kp = [90.0, 90.0] }\n");
        assert!(
            e.contains("setting[0].name") && e.contains("nominal"),
            "{e}"
        );
        let e = err("[[setting]]\nname = \" \"\n");
        assert!(e.contains("setting[0].name: must not be empty"), "{e}");
        let e = err("episodes = 5\n");
        assert!(e.contains("no settings"), "{e}");
    }

    #[test]
    fn every_field_of_the_tasks_randomisation_can_be_swept() {
        // The grid knows no field list: every field of the task's table is an axis.
        let nominal = nominal("");
        let table = nominal.randomization().unwrap().clone();
        let grid: toml::Table = table
            .iter()
            .map(|(k, v)| (k.clone(), toml::Value::Array(vec![v.clone()])))
            .collect();
        let sweep = SweepFile {
            grid,
            ..SweepFile::default()
        };
        let s = sweep.expand(&nominal).unwrap();
        assert_eq!(s.len(), table.len() + 1);
        for (setting, field) in s[1..].iter().zip(table.keys()) {
            assert_eq!(setting.fields, std::slice::from_ref(field));
            assert_eq!(setting.env, nominal, "{}", setting.name);
        }
    }

    #[test]
    fn observation_only_settings_are_skipped_for_the_other_modes() {
        let text = "[grid]\nimage_tint = [[0.5, 0.5]]\nobs_noise_rad = [0.1]\n\
             [[setting]]\nname = \"mixed\"\nrandomize = { image_tint = [0.8, 1.2], kp = [90.0, 90.0] }\n\
             [[setting]]\nname = \"same as nominal\"\n";
        let skipped = |obs: &str| {
            expand(text, &observing(&nominal(""), obs))
                .unwrap()
                .iter()
                .filter(|x| x.irrelevant().is_some())
                .map(|x| x.name.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(skipped("state"), ["image_tint = [0.5, 0.5]"]);
        assert_eq!(skipped("keypoints"), ["image_tint = [0.5, 0.5]"]);
        assert_eq!(skipped("pixels"), ["obs_noise_rad = 0.1"]);
        let s = expand(text, &observing(&nominal(""), "state")).unwrap();
        assert_eq!(
            s[2].name, "image_tint = [0.5, 0.5]",
            "grid order, not file order"
        );
        assert_eq!(
            s[2].irrelevant().unwrap(),
            "image_tint only changes pixel observations (the policy observes states)"
        );
    }

    fn table() -> RobustnessTable {
        let settings = expand("[grid]\nfriction = [[1.0, 1.0]]\n", &nominal("")).unwrap();
        let report = |successes: usize, score: f64| EvalReport {
            episodes: 10,
            successes,
            success_rate: successes as f64 / 10.0,
            ci95: [0.1, 0.5],
            mean_max_score: score,
            mean_max_reward: None,
            mean_length: 200.0,
            seed: 1,
            envs: 2,
            metrics: Default::default(),
            per_episode: Vec::new(),
        };
        RobustnessTable {
            policy: "runs/x/policy".into(),
            sweep: "s.toml".into(),
            config: None,
            obs: "state".into(),
            randomization: "env.randomize".into(),
            episodes: 10,
            seed: 1,
            envs: 2,
            stochastic: false,
            seconds: 3.0,
            rows: RobustnessTable::rows(&settings, &[report(3, 0.7), report(1, 0.55)]),
            skipped: Vec::new(),
        }
    }

    #[test]
    fn markdown_table_has_deltas_against_nominal() {
        let t = table().markdown_table();
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[0],
            "| setting | success | 95% CI | mean max score | Δ vs nominal (success, score) |"
        );
        assert_eq!(
            lines[2],
            "| nominal | 30.0% (3/10) | 10.0-50.0% | 0.700 | - |"
        );
        assert_eq!(
            lines[3],
            "| friction = [1.0, 1.0] | 10.0% (1/10) | 10.0-50.0% | 0.550 | -20.0 pp, -0.150 |"
        );
    }

    /// A task that reports episode metrics gets one column per metric, its mean per row
    /// (rates in percent), and "-" where a row lacks it.
    #[test]
    fn task_metrics_get_a_column_each() {
        let mut t = table();
        let m = |values: &[f64]| MetricSummary::of(values).unwrap();
        t.rows[0].metrics = [
            ("collision".to_string(), m(&[0.0, 1.0, 0.0, 0.0])),
            ("ade".to_string(), m(&[6.0, 6.5])),
        ]
        .into();
        t.rows[1].metrics = [("collision".to_string(), m(&[1.0, 1.0, 0.0, 0.0]))].into();
        let md = t.markdown_table();
        let lines: Vec<&str> = md.lines().collect();
        assert!(lines[0].ends_with("| ade | collision |"), "{}", lines[0]);
        assert_eq!(lines[1], "|---|---|---|---|---|---|---|");
        assert!(lines[2].ends_with("| - | 6.250 | 25.0% |"), "{}", lines[2]);
        assert!(lines[3].ends_with("| - | 50.0% |"), "{}", lines[3]);
        let json = serde_json::to_value(&t.rows[0]).unwrap();
        assert_eq!(json["metrics"]["collision"]["mean"], 0.25);
        // Without metrics the table and the JSON rows are as before.
        assert!(
            table()
                .markdown_table()
                .lines()
                .next()
                .unwrap()
                .ends_with("score) |")
        );
        assert!(
            serde_json::to_value(&table().rows[0])
                .unwrap()
                .get("metrics")
                .is_none()
        );
    }

    #[test]
    fn tiny_losses_do_not_print_as_negative_zero() {
        let mut t = table();
        t.rows[1].delta_mean_max_score = -0.0004;
        t.rows[1].delta_success_rate = 0.0;
        assert!(t.markdown_table().contains("| +0.0 pp, +0.000 |"));
    }

    #[test]
    fn report_section_is_appended_once_and_then_replaced() {
        let body = table().markdown_body();
        let fresh = upsert_section("", &body);
        assert!(
            fresh.starts_with("# diffrl report\n\n## Robustness\n\n"),
            "{fresh}"
        );
        let doc = "# run\n\n## Stages\n\nstuff\n";
        let once = upsert_section(doc, &body);
        assert!(once.starts_with(doc), "{once}");
        assert_eq!(once.matches(SECTION).count(), 1);
        let twice = upsert_section(&once, &body);
        assert_eq!(twice, once);
        // A section in the middle is replaced in place; later sections survive.
        let middle = "# run\n\n## Robustness\n\nold table\n\n## Notes\n\nkeep me\n";
        let new = upsert_section(middle, "new table\n");
        assert_eq!(
            new,
            "# run\n\n## Robustness\n\nnew table\n\n## Notes\n\nkeep me\n"
        );
    }
}
