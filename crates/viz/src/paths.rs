//! Entity paths of a diffrl recording (documented in docs/viz.md; the blueprint's views are
//! rooted at them). Scene shapes add their own name under [`SCENE`]; training scalars live at
//! `train/<topic>/<name>`; per-step series at `rewards/<series>`.

/// The recorded environment's scene (`scene/<shape name>`).
pub const SCENE: &str = "scene";
/// A faint box around the scene's bounds (keeps the view framed on the arena).
pub const SCENE_BOUNDS: &str = "scene/bounds";
/// The predicted action chunk of the last policy call (line strip over the scene).
pub const ACTIONS_PREDICTED: &str = "scene/actions/predicted";
/// The executed part of that chunk.
pub const ACTIONS_EXECUTED: &str = "scene/actions/executed";
/// The camera image the policy sees (pixel observations only).
pub const PIXELS: &str = "pixels";
/// A 3-D scene's bodies (`scene3d/<body name>`, each with its transform).
pub const SCENE3D: &str = "scene3d";
/// The path of a 3-D scene's tool point (end effector) through the current episode.
pub const TOOL_PATH: &str = "scene3d/tool_path";
/// Root of the action chunk of the last policy call in a 3-D scene (`predicted`, `executed`).
pub const ACTIONS3D: &str = "scene3d/actions";
/// The predicted chunk as a 3-D path.
pub const ACTIONS3D_PREDICTED: &str = "scene3d/actions/predicted";
/// Its executed part.
pub const ACTIONS3D_EXECUTED: &str = "scene3d/actions/executed";
/// x_K..x_0 of the last policy call as 3-D paths coloured by k.
pub const CHAIN3D: &str = "scene3d/chain";
/// Root of the policy's occlusion saliency (pixel policies, evaluations).
pub const SALIENCY: &str = "saliency";
/// The policy's newest camera frame blended with a heat map (black .. red .. white) of how far
/// its action chunk moves when each square is hidden, scaled to the call's largest value.
pub const SALIENCY_FRAME: &str = "saliency/frame";
/// That largest value per policy call (RMS change of the chunk, normalised action units).
pub const SALIENCY_MAX: &str = "saliency/max";
/// Further named camera images of a scene (`cameras/<name>`).
pub const CAMERAS: &str = "cameras";
/// Root of the denoising chain view.
pub const CHAIN: &str = "chain";
/// x_K..x_0 of the last policy call as line strips coloured by k.
pub const CHAIN_X: &str = "chain/x";
/// log pi(x_{k-1} | x_k, s) per denoising step, on the `denoise_step` timeline.
pub const CHAIN_LOGP: &str = "chain/logp";
/// Per-step series of the recorded rollout (`rewards/reward`, `rewards/advantage`, ...).
pub const REWARDS: &str = "rewards";
/// Root of training scalars (`train/<topic>/<name>`).
pub const TRAIN: &str = "train";
/// Group statistics per update.
pub const GROUPS: &str = "groups";
/// Per-group mean outcome (one series per group).
pub const GROUPS_MEAN: &str = "groups/mean";
/// Per-group outcome standard deviation.
pub const GROUPS_STD: &str = "groups/std";
/// Fraction of groups whose outcomes are all equal.
pub const GROUPS_ZERO_VAR: &str = "groups/zero_variance_frac";
/// Root of evaluation logs.
pub const EVAL: &str = "eval";
/// One text line per finished evaluation episode.
pub const EVAL_EPISODES: &str = "eval/episodes";
/// Evaluation summaries.
pub const EVAL_SUMMARY: &str = "eval/summary";
/// Root of the sim-to-real robustness table of `diffrl eval --randomize`.
pub const ROBUSTNESS: &str = "robustness";
/// The robustness table (Markdown).
pub const ROBUSTNESS_TABLE: &str = "robustness/table";
/// Success rate per setting (bar chart, settings in table order).
pub const ROBUSTNESS_SUCCESS: &str = "robustness/success_rate";
/// Mean max score per setting (bar chart).
pub const ROBUSTNESS_SCORE: &str = "robustness/mean_max_score";
/// Run-level notes (which command, which settings).
pub const RUN_LOG: &str = "log";
