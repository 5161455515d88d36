//! `diffrl eval --randomize SWEEP.toml`: how a policy holds up when the simulator's physics and
//! observations move away from the ones it was trained on (sim-to-real robustness).
//!
//! A sweep file lists domain-randomisation settings around the nominal `[env.randomize]` of the
//! run config: one grid axis at a time (`[grid]`) and named settings (`[[setting]]`). Every
//! setting plays the same seeded episodes (same initial states), so settings differ only in
//! physics and observations, and the nominal row equals a plain `diffrl eval` with the same
//! seed and episode count. The results form a [`RobustnessTable`], written as
//! `robustness.json` and `robustness.md` and as a `## Robustness` section of `report.md`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use burn::tensor::backend::{AutodiffBackend, Backend};
use diffrl_core::ConfigError;
use diffrl_core::config::{Invalid, Validate, ensure};
use diffrl_core::fs::write_atomic;
use diffrl_learn::LearnError;
use diffrl_learn::eval::{EvalReport, evaluate};
use diffrl_policy::{Policy, SampleMode, checkpoint};
use diffrl_pusht::{ObsMode, Randomization};
use serde::{Deserialize, Serialize};

use crate::config::{self, RunConfig};
use crate::train::{EvalArgs, bar, check_spec, env_spec, vec_env};

/// The machine-readable table, written next to the policy's evaluation.
pub const JSON_FILE: &str = "robustness.json";
/// The Markdown table.
pub const MARKDOWN_FILE: &str = "robustness.md";
/// The run report that receives (or has replaced) its `## Robustness` section.
pub const REPORT_FILE: &str = "report.md";
/// The heading of the section in `report.md`.
const SECTION: &str = "## Robustness";

/// A closed range `[lo, hi]`, as in [`Randomization`].
type Range = [f64; 2];

/// A sweep file (`diffrl eval --randomize FILE.toml`; the Push-T default grid is
/// `configs/pusht_randomize.toml`). Unknown keys are errors.
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
    /// One axis at a time around the nominal `[env.randomize]`: each value of each axis is a
    /// setting named like `friction = [0.5, 0.5]`, with every other field nominal. Settings
    /// appear in the order of [`Grid`]'s fields, then in the order of the values.
    #[serde(default)]
    pub grid: Grid,
    /// Named settings (`[[setting]]`), after the grid's.
    #[serde(default, rename = "setting")]
    pub settings: Vec<NamedSetting>,
}

/// `[grid]`: values of single [`Randomization`] fields, each tried with the rest nominal. A
/// range `[lo, hi]` is drawn uniformly at every reset; `[v, v]` fixes the value.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Grid {
    /// Block mass ranges (gym-pusht: `[1.0, 1.0]`).
    pub block_mass: Vec<Range>,
    /// Block moment-of-inertia ranges (gym-pusht: `[3000.0, 3000.0]`).
    pub block_inertia: Vec<Range>,
    /// Friction coefficient ranges of all shapes (gym-pusht: `[0.0, 0.0]`).
    pub friction: Vec<Range>,
    /// PD proportional gain ranges (gym-pusht: `[100.0, 100.0]`).
    pub kp: Vec<Range>,
    /// PD derivative gain ranges (gym-pusht: `[20.0, 20.0]`).
    pub kv: Vec<Range>,
    /// Action delays in control steps, integer ranges (gym-pusht: `[0, 0]`).
    pub action_delay: Vec<[u32; 2]>,
    /// Standard deviations of the noise on observed positions, in pixels (gym-pusht: 0).
    pub obs_noise_px: Vec<f64>,
    /// Standard deviations of the noise on the observed angle, in radians (gym-pusht: 0);
    /// skipped for pixel policies, which do not observe the angle.
    pub obs_noise_rad: Vec<f64>,
    /// Per-channel brightness multiplier ranges of pixel observations (gym-pusht:
    /// `[1.0, 1.0]`; `[v, v]` is a brightness shift, a wider range a colour shift); skipped
    /// for policies that observe states.
    pub image_tint: Vec<Range>,
}

/// `[[setting]]`: a named setting.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamedSetting {
    /// Row label, unique within the sweep (`nominal` is taken).
    pub name: String,
    /// The fields that differ from the nominal `[env.randomize]`, e.g.
    /// `{ friction = [0.0, 1.0], action_delay = [0, 3] }`; the rest stay nominal.
    #[serde(default)]
    pub randomize: RandomizationPatch,
}

/// Any subset of [`Randomization`]'s fields (see there for their meaning and units).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RandomizationPatch {
    /// Block mass range.
    pub block_mass: Option<Range>,
    /// Block moment-of-inertia range.
    pub block_inertia: Option<Range>,
    /// Friction coefficient range.
    pub friction: Option<Range>,
    /// PD proportional gain range.
    pub kp: Option<Range>,
    /// PD derivative gain range.
    pub kv: Option<Range>,
    /// Action delay range in control steps.
    pub action_delay: Option<[u32; 2]>,
    /// Position noise standard deviation (pixels).
    pub obs_noise_px: Option<f64>,
    /// Angle noise standard deviation (radians).
    pub obs_noise_rad: Option<f64>,
    /// Per-channel brightness multiplier range of pixel observations.
    pub image_tint: Option<Range>,
}

impl RandomizationPatch {
    /// `nominal` with the fields this patch sets replaced.
    pub fn apply(&self, nominal: &Randomization) -> Randomization {
        let mut r = nominal.clone();
        macro_rules! set {
            ($($field:ident),*) => {$(
                if let Some(v) = self.$field {
                    r.$field = v;
                }
            )*};
        }
        set!(
            block_mass,
            block_inertia,
            friction,
            kp,
            kv,
            action_delay,
            obs_noise_px,
            obs_noise_rad,
            image_tint
        );
        r
    }

    /// Names of the fields this patch sets.
    pub fn fields(&self) -> Vec<&'static str> {
        let mut names = Vec::new();
        macro_rules! collect {
            ($($field:ident),*) => {$(
                if self.$field.is_some() {
                    names.push(stringify!($field));
                }
            )*};
        }
        collect!(
            block_mass,
            block_inertia,
            friction,
            kp,
            kv,
            action_delay,
            obs_noise_px,
            obs_noise_rad,
            image_tint
        );
        names
    }
}

/// One grid value as a setting: where it is in the file, its label and its patch.
struct GridEntry {
    field: &'static str,
    index: usize,
    name: String,
    patch: RandomizationPatch,
}

impl Grid {
    fn entries(&self) -> Vec<GridEntry> {
        let mut out = Vec::new();
        macro_rules! axes {
            ($($field:ident),*) => {$(
                for (index, v) in self.$field.iter().enumerate() {
                    out.push(GridEntry {
                        field: stringify!($field),
                        index,
                        name: format!("{} = {v:?}", stringify!($field)),
                        patch: RandomizationPatch {
                            $field: Some(*v),
                            ..Default::default()
                        },
                    });
                }
            )*};
        }
        axes!(
            block_mass,
            block_inertia,
            friction,
            kp,
            kv,
            action_delay,
            obs_noise_px,
            obs_noise_rad,
            image_tint
        );
        out
    }
}

/// A setting ready to run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Setting {
    /// Row label.
    pub name: String,
    /// Where it comes from: `nominal`, `grid.friction[1]`, `setting[0]`.
    pub origin: String,
    /// The randomisation the episodes use.
    pub randomize: Randomization,
    /// The fields the sweep sets (empty for the nominal row).
    pub fields: Vec<String>,
}

impl Setting {
    /// Why this setting cannot change what a policy observing `obs` does, if it cannot: every
    /// field it sets only affects another observation mode.
    pub fn irrelevant_for(&self, obs: ObsMode) -> Option<String> {
        let why = |field: &str| match field {
            "image_tint" if obs != ObsMode::Pixels => {
                Some("image_tint only changes pixel observations")
            }
            "obs_noise_rad" if obs == ObsMode::Pixels => {
                Some("obs_noise_rad only changes the observed block angle")
            }
            _ => None,
        };
        if self.fields.is_empty() {
            return None;
        }
        let mut reasons = self
            .fields
            .iter()
            .map(|f| why(f))
            .collect::<Option<Vec<&str>>>()?;
        reasons.dedup();
        Some(format!(
            "{} (the policy observes {})",
            reasons.join("; "),
            obs_name(obs)
        ))
    }
}

fn obs_name(obs: ObsMode) -> &'static str {
    match obs {
        ObsMode::State => "states",
        ObsMode::Keypoints => "keypoints",
        ObsMode::Pixels => "pixels",
    }
}

impl SweepFile {
    /// The settings to evaluate, nominal first, each checked with the simulator's
    /// [`Validate`]; errors name the grid value or setting (`grid.friction[1]`).
    pub fn expand(&self, nominal: &Randomization) -> Result<Vec<Setting>, Invalid> {
        let mut settings = vec![Setting {
            name: "nominal".into(),
            origin: "nominal".into(),
            randomize: nominal.clone(),
            fields: Vec::new(),
        }];
        for e in self.grid.entries() {
            let origin = format!("grid.{}[{}]", e.field, e.index);
            let randomize = e.patch.apply(nominal);
            randomize
                .validate()
                .map_err(|i| Invalid::new(origin.clone(), i.message))?;
            if let Some(first) = settings.iter().find(|s| s.name == e.name) {
                return Err(Invalid::new(
                    origin,
                    format!("repeats {} ({})", first.origin, e.name),
                ));
            }
            settings.push(Setting {
                name: e.name,
                origin,
                randomize,
                fields: vec![e.field.to_string()],
            });
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
            let randomize = s.randomize.apply(nominal);
            randomize.validate().map_err(|e| {
                Invalid::new(
                    format!("{origin}.randomize.{}", e.field),
                    format!("{} (setting {:?})", e.message, s.name),
                )
            })?;
            settings.push(Setting {
                name: s.name.clone(),
                origin,
                randomize,
                fields: s.randomize.fields().into_iter().map(String::from).collect(),
            });
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
    /// Checks the file on its own: each field of [`Randomization`] is validated independently,
    /// so a value valid around gym-pusht's defaults is valid around any valid nominal.
    fn validate(&self) -> Result<(), Invalid> {
        ensure(self.episodes != Some(0), "episodes", "must be at least 1")?;
        self.expand(&Randomization::default()).map(|_| ())
    }
}

/// One evaluated setting.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RobustnessRow {
    /// Row label.
    pub name: String,
    /// Where it comes from in the sweep file (`nominal`, `grid.kp[0]`, `setting[2]`).
    pub origin: String,
    /// The randomisation used.
    pub randomize: Randomization,
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
    /// What the policy observes.
    pub obs: ObsMode,
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
            })
            .collect()
    }

    /// The Markdown table alone: setting | success | 95% CI | mean max score | Δ vs nominal.
    pub fn markdown_table(&self) -> String {
        let mut t = String::from(
            "| setting | success | 95% CI | mean max score | Δ vs nominal (success, score) |\n\
             |---|---|---|---|---|\n",
        );
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
                "| {} | {:.1}% ({}/{}) | {:.1}-{:.1}% | {:.3} | {delta} |\n",
                r.name.replace('|', "\\|"),
                100.0 * r.success_rate,
                r.successes,
                r.episodes,
                100.0 * r.ci95[0],
                100.0 * r.ci95[1],
                r.mean_max_score,
            ));
        }
        t
    }

    /// The section body shared by `robustness.md` and `report.md`: settings, table, skips.
    pub fn markdown_body(&self) -> String {
        let config = self.config.as_ref().map_or_else(
            || "the embedded `configs/pusht.toml`".to_string(),
            |p| format!("`{}`", p.display()),
        );
        let mut s = format!(
            "Policy `{}` under the settings of `{}` around the nominal `[env.randomize]` of \
             {config}: {} episodes per setting, root seed {}, {} environments, {} chains. Every \
             setting starts from the same states. Success with Wilson 95% intervals; Δ in \
             percentage points of success and in mean max score. Wall time {:.0} s.\n\n",
            self.policy.display(),
            self.sweep.display(),
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
        setting_cfg.env.randomize = s.randomize.clone();
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
        cfg.env.randomize.action_delay = [d, d];
        cfg.env
            .randomize
            .validate()
            .map_err(|i| anyhow::anyhow!("--action-delay {d}: {}", i.message))?;
    }
    let sweep: SweepFile = diffrl_core::config::load(sweep_path)?;
    let all = sweep
        .expand(&cfg.env.randomize)
        .map_err(|i| ConfigError::Invalid {
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
    let obs = cfg.env.obs;
    let mut settings = Vec::new();
    let mut skipped = Vec::new();
    for s in all {
        match s.irrelevant_for(obs) {
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
        let (policy, _) =
            checkpoint::load::<<B as AutodiffBackend>::InnerBackend>(args.policy_dir(), &device)
                .with_context(|| format!("loading the policy {}", args.policy_dir().display()))?;
        check_spec(
            &policy.spec,
            &env_spec(&cfg)?,
            &format!("the policy {}", args.policy_dir().display()),
        )?;
        run_settings(&cfg, &policy, &device, &settings, episodes, seed, mode)
            .map_err(anyhow::Error::from)
    })?;
    let table = RobustnessTable {
        policy: args.policy_dir().to_path_buf(),
        sweep: sweep_path.to_path_buf(),
        config: args.config.clone(),
        obs,
        episodes,
        seed,
        envs: cfg.eval.envs.min(episodes),
        stochastic: args.stochastic,
        seconds: t0.elapsed().as_secs_f64(),
        rows: RobustnessTable::rows(&settings, &reports),
        skipped,
    };
    write_table(&dir, &table)?;
    crate::viz::record_robustness(recording.recorder(), &table);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<SweepFile, ConfigError> {
        diffrl_core::config::from_toml_str(text, Path::new("configs/x.toml"))
    }

    fn names(s: &[Setting]) -> Vec<&str> {
        s.iter().map(|s| s.name.as_str()).collect()
    }

    #[test]
    fn shipped_default_grid_parses_and_expands() {
        let text = include_str!("../../../configs/pusht_randomize.toml");
        let sweep = parse(text).unwrap();
        let settings = sweep.expand(&Randomization::default()).unwrap();
        assert_eq!(settings[0].name, "nominal");
        assert!(settings.len() > 10, "{:?}", names(&settings));
        assert!(names(&settings).contains(&"action_delay = [4, 4]"));
        // A state policy skips only the image settings; a pixel policy the angle noise.
        let skipped_state: Vec<_> = settings
            .iter()
            .filter(|s| s.irrelevant_for(ObsMode::State).is_some())
            .collect();
        assert!(!skipped_state.is_empty());
        assert!(
            skipped_state
                .iter()
                .all(|s| s.fields == ["image_tint"] && s.origin.starts_with("grid.image_tint"))
        );
    }

    #[test]
    fn grid_expands_one_axis_at_a_time_around_nominal() {
        let sweep = parse(
            "episodes = 3\nseed = 7\n[grid]\nfriction = [[0.0, 0.0], [0.5, 1.0]]\n\
             action_delay = [[2, 2]]\nobs_noise_px = [2.0]\n\
             [[setting]]\nname = \"rough and late\"\n\
             randomize = { friction = [0.0, 1.0], action_delay = [0, 3] }\n",
        )
        .unwrap();
        assert_eq!((sweep.episodes, sweep.seed), (Some(3), Some(7)));
        let nominal = Randomization {
            kp: [80.0, 80.0],
            ..Randomization::default()
        };
        let s = sweep.expand(&nominal).unwrap();
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
        assert_eq!(s[0].randomize, nominal);
        assert_eq!(
            s[2].randomize,
            Randomization {
                friction: [0.5, 1.0],
                ..nominal.clone()
            }
        );
        assert_eq!(s[2].origin, "grid.friction[1]");
        assert_eq!(
            s[5].randomize,
            Randomization {
                friction: [0.0, 1.0],
                action_delay: [0, 3],
                ..nominal.clone()
            }
        );
        assert_eq!(s[5].fields, ["friction", "action_delay"]);
        assert_eq!(s[5].origin, "setting[0]");
    }

    #[test]
    fn errors_name_the_file_the_setting_and_the_field() {
        let err = |text: &str| parse(text).unwrap_err().to_string();
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
    fn grid_and_patch_cover_every_randomization_field() {
        // A field added to Randomization must be added to Grid and RandomizationPatch too:
        // both deny unknown fields, so this fails until it is.
        let full = Randomization {
            block_mass: [0.5, 2.0],
            block_inertia: [1000.0, 5000.0],
            friction: [0.1, 0.2],
            kp: [50.0, 60.0],
            kv: [5.0, 6.0],
            action_delay: [1, 3],
            obs_noise_px: 1.5,
            obs_noise_rad: 0.25,
            image_tint: [0.5, 1.5],
        };
        let table = toml::Table::try_from(&full).unwrap();
        let patch: RandomizationPatch = table.clone().try_into().unwrap();
        assert_eq!(patch.apply(&Randomization::default()), full);
        assert_eq!(patch.fields().len(), table.len());
        let grid_table: toml::Table = table
            .into_iter()
            .map(|(k, v)| (k, toml::Value::Array(vec![v])))
            .collect();
        let grid: Grid = grid_table.clone().try_into().unwrap();
        let entries = grid.entries();
        assert_eq!(entries.len(), grid_table.len());
        for e in entries {
            let r = e.patch.apply(&Randomization::default());
            assert_ne!(r, Randomization::default(), "{}", e.name);
            assert_eq!(e.patch.fields(), [e.field]);
        }
    }

    #[test]
    fn observation_only_settings_are_skipped_for_the_other_modes() {
        let sweep = parse(
            "[grid]\nimage_tint = [[0.5, 0.5]]\nobs_noise_rad = [0.1]\n\
             [[setting]]\nname = \"mixed\"\nrandomize = { image_tint = [0.8, 1.2], kp = [90.0, 90.0] }\n\
             [[setting]]\nname = \"same as nominal\"\n",
        )
        .unwrap();
        let s = sweep.expand(&Randomization::default()).unwrap();
        let skipped = |obs| {
            s.iter()
                .filter(|x| x.irrelevant_for(obs).is_some())
                .map(|x| x.name.as_str())
                .collect::<Vec<_>>()
        };
        assert_eq!(skipped(ObsMode::State), ["image_tint = [0.5, 0.5]"]);
        assert_eq!(skipped(ObsMode::Keypoints), ["image_tint = [0.5, 0.5]"]);
        assert_eq!(skipped(ObsMode::Pixels), ["obs_noise_rad = 0.1"]);
        assert_eq!(
            s[2].name, "image_tint = [0.5, 0.5]",
            "grid order, not file order"
        );
        let why = s[2].irrelevant_for(ObsMode::State).unwrap();
        assert_eq!(
            why,
            "image_tint only changes pixel observations (the policy observes states)"
        );
    }

    fn table() -> RobustnessTable {
        let settings = parse("[grid]\nfriction = [[1.0, 1.0]]\n")
            .unwrap()
            .expand(&Randomization::default())
            .unwrap();
        let report = |successes: usize, score: f64| EvalReport {
            episodes: 10,
            successes,
            success_rate: successes as f64 / 10.0,
            ci95: [0.1, 0.5],
            mean_max_score: score,
            mean_length: 200.0,
            seed: 1,
            envs: 2,
            per_episode: Vec::new(),
        };
        RobustnessTable {
            policy: "runs/x/policy".into(),
            sweep: "s.toml".into(),
            config: None,
            obs: ObsMode::State,
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
