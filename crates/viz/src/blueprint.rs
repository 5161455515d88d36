//! The default viewer layout, sent with every recording (the Rust SDK of Rerun 0.36 builds and
//! sends blueprints itself; a saved .rrd carries it first, so `rerun FILE.rrd` opens in it).
//!
//! ```text
//! +--------------------+-----------------------------------------------+
//! | scene | pixels     | training | rollouts | episodes | robustness   |
//! |  (2-D top view)    |  one time series per topic (loss, kl, clip,  |
//! +--------------------+  success, reward, lr, grad, speed), on       |
//! | denoising chain    |  train_step                                   |
//! |  x_K..x_0 by k     |                                               |
//! +--------------------+-----------------------------------------------+
//! ```
//!
//! A scene that predicts its agents' paths from action chunks (the driving tasks) gets the
//! [`Layout::Road`] variant: the chain view draws each denoising chain as the agents' paths over
//! the bird's-eye road (`scene/` without the executed and predicted chunks, under `chain/x`),
//! so a chain reads as trajectories converging from noise onto the lanes. The recorder sends it
//! when the first such scene arrives.
//!
//! A 3-D task gets the [`Layout::Solid`] variant: the left column's scene tab is a 3-D view of
//! `scene3d/` (bodies, the end effector's path, the action chunk), beside tabs for the policy's
//! pixels and the named cameras; the chain view shows each denoising chain as 3-D paths of the
//! end effector over the path it is drawn from. The recorder sends it when the first 3-D scene
//! arrives.
//!
//! Every layout has a `saliency` tab beside the pixels: where a pixel policy looked during an
//! evaluation (`saliency/frame`, the occlusion map over its camera frame) and the largest
//! value per policy call (`saliency/max`).

use diffrl_core::record::{Timeline, Topic};
use rerun::blueprint::components::PanelState;
use rerun::blueprint::{
    BarChartView, Blueprint, BlueprintPanel, ContainerLike, Grid, Horizontal, SelectionPanel,
    Spatial2DView, Spatial3DView, Tabs, TextDocumentView, TextLogView, TimePanel, TimeSeriesView,
    Vertical,
};

use crate::paths;

fn root(p: &str) -> String {
    format!("/{p}")
}

/// What the scene view shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// A 2-D top view (`scene/`), actions and chains as 2-D points.
    Flat,
    /// A 3-D world (`scene3d/`), actions and chains as 3-D paths.
    Solid,
    /// A 2-D road scene whose actions are the agents' paths: chains drawn over the road.
    Road,
}

/// The layout described in the module docs, its time panel on `timeline` (training commands
/// open on `train_step`, where the loss curves are; evaluations on `env_step`). Plots of the
/// other timeline stay empty until it is selected in the time panel.
pub fn default_blueprint(timeline: Timeline, layout: Layout) -> Blueprint {
    let pixels = Spatial2DView::new("pixels").with_origin(root(paths::PIXELS));
    let saliency = || -> ContainerLike {
        Vertical::new([
            Spatial2DView::new("saliency (hidden square -> chunk change)")
                .with_origin(root(paths::SALIENCY_FRAME))
                .into(),
            TimeSeriesView::new("largest saliency")
                .with_origin(root(paths::SALIENCY_MAX))
                .into(),
        ])
        .with_row_shares([3.0, 1.0])
        .with_name("saliency")
        .into()
    };
    let left = match layout {
        Layout::Flat => {
            let scene = Tabs::new([
                ContainerLike::from(Spatial2DView::new("scene").with_origin(root(paths::SCENE))),
                pixels.into(),
                saliency(),
            ]);
            let chain = Spatial2DView::new("denoising chain (x_K blue .. x_0 red)")
                .with_origin(root(paths::CHAIN))
                .with_contents([format!("/{}/**", paths::CHAIN_X)]);
            Vertical::new([scene.into(), chain.into()])
        }
        Layout::Road => {
            let scene = Tabs::new([
                ContainerLike::from(
                    Spatial2DView::new("bird's-eye scene").with_origin(root(paths::SCENE)),
                ),
                pixels.into(),
                saliency(),
            ]);
            let chain = Spatial2DView::new("denoising chain over the road (x_K blue .. x_0 red)")
                .with_origin("/")
                .with_contents([
                    format!("/{}/**", paths::SCENE),
                    format!("- /{}/actions/**", paths::SCENE),
                    format!("/{}/**", paths::CHAIN_X),
                ]);
            Vertical::new([scene.into(), chain.into()])
        }
        Layout::Solid => {
            let scene = Tabs::new([
                ContainerLike::from(Spatial3DView::new("scene").with_origin(root(paths::SCENE3D))),
                pixels.into(),
                Spatial2DView::new("cameras")
                    .with_origin(root(paths::CAMERAS))
                    .into(),
                saliency(),
            ]);
            let chain = Spatial3DView::new("denoising chain (x_K blue .. x_0 red)")
                .with_origin(root(paths::SCENE3D))
                .with_contents([
                    format!("/{}/**", paths::CHAIN3D),
                    format!("/{}/**", paths::ACTIONS3D),
                    root(paths::TOOL_PATH),
                ]);
            Vertical::new([scene.into(), chain.into()])
        }
    };

    let topics: Vec<ContainerLike> = Topic::ALL
        .iter()
        .map(|t| {
            TimeSeriesView::new(t.name())
                .with_origin(format!("/{}/{}", paths::TRAIN, t.name()))
                .into()
        })
        .collect();
    let training = Grid::new(topics).with_name("training");
    let rollouts = Vertical::new([
        TimeSeriesView::new("per-step rewards and advantages")
            .with_origin(root(paths::REWARDS))
            .into(),
        TimeSeriesView::new("chain log-probs (denoise_step)")
            .with_origin(root(paths::CHAIN_LOGP))
            .into(),
        TimeSeriesView::new("groups")
            .with_origin(root(paths::GROUPS))
            .into(),
    ])
    .with_name("rollouts");
    let episodes = Vertical::new([
        TextLogView::new("episodes")
            .with_origin(root(paths::EVAL))
            .into(),
        TextLogView::new("log")
            .with_origin(root(paths::RUN_LOG))
            .into(),
    ])
    .with_name("episodes");
    let robustness = Horizontal::new([
        TextDocumentView::new("robustness table")
            .with_origin(root(paths::ROBUSTNESS_TABLE))
            .into(),
        Vertical::new([
            BarChartView::new("success rate per setting")
                .with_origin(root(paths::ROBUSTNESS_SUCCESS))
                .into(),
            BarChartView::new("mean max score per setting")
                .with_origin(root(paths::ROBUSTNESS_SCORE))
                .into(),
        ])
        .into(),
    ])
    .with_name("robustness");
    let right = Tabs::new([
        training.into(),
        rollouts.into(),
        episodes.into(),
        robustness.into(),
    ]);
    Blueprint::new(Horizontal::new([left.into(), right.into()]).with_column_shares([0.4, 0.6]))
        .with_auto_views(false)
        // The views get the room; both side panels open with a click.
        .with_blueprint_panel(BlueprintPanel::new().with_state(PanelState::Collapsed))
        .with_selection_panel(SelectionPanel::new().with_state(PanelState::Collapsed))
        .with_time_panel(TimePanel::new().with_timeline(timeline.name()))
}
