//! Behaviour-cloning samples from recorded episodes: for every frame t, the observation window
//! [t - To + 1, t] (padded with the first frame) and the action chunk [t, t + Tp) (padded with
//! the last action), both normalised. The first Ta actions of a chunk are the ones executed.

use diffrl_core::episode::Episode;
use diffrl_core::normalize::{Normalizer, RunningStats};
use diffrl_policy::Normalizers;

use crate::LearnError;

/// Normalised (observation window, action chunk) pairs, flattened row-major.
#[derive(Debug, Clone)]
pub struct ChunkDataset {
    /// [N, To, Ds].
    pub obs: Vec<f32>,
    /// [N, Tp, Da].
    pub actions: Vec<f32>,
    /// Number of samples N.
    pub len: usize,
    /// To, Ds.
    pub obs_shape: [usize; 2],
    /// Tp, Da.
    pub action_shape: [usize; 2],
}

/// Checks the episodes and returns (state_dim, action_dim).
pub fn check_episodes(episodes: &[Episode]) -> Result<(usize, usize), LearnError> {
    let first = episodes
        .iter()
        .find(|e| !e.is_empty())
        .ok_or_else(|| LearnError::Data("no frames: the dataset is empty".into()))?;
    let (ds, da) = (first.observations[0].state.len(), first.actions[0].len());
    for (e, ep) in episodes.iter().enumerate() {
        for (t, (o, a)) in ep.observations.iter().zip(&ep.actions).enumerate() {
            if o.state.len() != ds || a.len() != da {
                return Err(LearnError::Data(format!(
                    "episode {e} frame {t}: state has {} values and action {} (expected {ds} and {da})",
                    o.state.len(),
                    a.len()
                )));
            }
            if let Some(v) = o.state.iter().chain(a).find(|v| !v.is_finite()) {
                return Err(LearnError::Data(format!(
                    "episode {e} frame {t}: non-finite value {v} in observation.state or action"
                )));
            }
        }
    }
    Ok((ds, da))
}

/// Min-max normalisers (to [-1, 1]) fitted on every frame.
pub fn fit_normalizers(episodes: &[Episode]) -> Result<Normalizers, LearnError> {
    let (ds, da) = check_episodes(episodes)?;
    let (mut s, mut a) = (RunningStats::new(ds), RunningStats::new(da));
    for ep in episodes {
        for (o, act) in ep.observations.iter().zip(&ep.actions) {
            s.push(&o.state);
            a.push(act);
        }
    }
    Ok(Normalizers {
        state: Normalizer::min_max(&s),
        action: Normalizer::min_max(&a),
    })
}

impl ChunkDataset {
    /// Builds every (window, chunk) pair of the episodes.
    pub fn build(
        episodes: &[Episode],
        obs_horizon: usize,
        pred_horizon: usize,
        norm: &Normalizers,
    ) -> Result<Self, LearnError> {
        let (ds, da) = check_episodes(episodes)?;
        if norm.state.dim() != ds || norm.action.dim() != da {
            return Err(LearnError::Data(format!(
                "the dataset has state dim {ds} and action dim {da}, the policy expects {} and {}",
                norm.state.dim(),
                norm.action.dim()
            )));
        }
        let (mut obs, mut actions) = (Vec::new(), Vec::new());
        let mut len = 0;
        for ep in episodes.iter().filter(|e| !e.is_empty()) {
            let n = ep.len() as isize;
            for t in 0..n {
                for j in (t - obs_horizon as isize + 1)..=t {
                    let mut s = ep.observations[j.max(0) as usize].state.clone();
                    norm.state.normalize(&mut s);
                    obs.extend(s);
                }
                for j in t..t + pred_horizon as isize {
                    let mut a = ep.actions[j.min(n - 1) as usize].clone();
                    norm.action.normalize(&mut a);
                    actions.extend(a);
                }
                len += 1;
            }
        }
        Ok(Self {
            obs,
            actions,
            len,
            obs_shape: [obs_horizon, ds],
            action_shape: [pred_horizon, da],
        })
    }

    /// Gathers rows `idx` into (obs [B, To, Ds], actions [B, Tp, Da]) flat buffers.
    pub fn gather(&self, idx: &[usize]) -> (Vec<f32>, Vec<f32>) {
        let (no, na) = (
            self.obs_shape[0] * self.obs_shape[1],
            self.action_shape[0] * self.action_shape[1],
        );
        let mut o = Vec::with_capacity(idx.len() * no);
        let mut a = Vec::with_capacity(idx.len() * na);
        for &i in idx {
            o.extend_from_slice(&self.obs[i * no..(i + 1) * no]);
            a.extend_from_slice(&self.actions[i * na..(i + 1) * na]);
        }
        (o, a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use diffrl_core::space::Observation;

    fn episode(n: usize) -> Episode {
        let mut e = Episode::default();
        for t in 0..n {
            e.push(
                Observation::state(vec![t as f32, 0.0]),
                vec![t as f32 * 2.0],
                0.0,
                0.0,
                false,
            );
        }
        e
    }

    #[test]
    fn windows_pad_with_first_frame_and_last_action() {
        let eps = vec![episode(4)];
        let norm = Normalizers {
            state: Normalizer::MeanStd {
                mean: vec![0.0, 0.0],
                std: vec![1.0, 1.0],
            },
            action: Normalizer::MeanStd {
                mean: vec![0.0],
                std: vec![1.0],
            },
        };
        let d = ChunkDataset::build(&eps, 2, 3, &norm).unwrap();
        assert_eq!(d.len, 4);
        let (o, a) = d.gather(&[0, 3]);
        assert_eq!(o, vec![0.0, 0.0, 0.0, 0.0, 2.0, 0.0, 3.0, 0.0]);
        assert_eq!(a, vec![0.0, 2.0, 4.0, 6.0, 6.0, 6.0]);
    }

    #[test]
    fn bad_data_is_named() {
        assert!(matches!(check_episodes(&[]), Err(LearnError::Data(m)) if m.contains("empty")));
        let mut e = episode(3);
        e.observations[1].state[0] = f32::NAN;
        let err = check_episodes(&[episode(2), e]).unwrap_err().to_string();
        assert!(
            err.contains("episode 1 frame 1") && err.contains("NaN"),
            "{err}"
        );
        let mut e = episode(3);
        e.actions[2] = vec![1.0, 2.0];
        let err = check_episodes(&[e]).unwrap_err().to_string();
        assert!(err.contains("episode 0 frame 2"), "{err}");
    }
}
