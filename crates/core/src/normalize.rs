//! Running statistics (Welford) and the normalisers stored with models and datasets.

use serde::{Deserialize, Serialize};

/// Per-component running mean, variance, min and max (Welford's algorithm, f64).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunningStats {
    /// Samples seen.
    pub count: u64,
    /// Mean per component.
    pub mean: Vec<f64>,
    /// Sum of squared deviations per component.
    pub m2: Vec<f64>,
    /// Minimum per component.
    pub min: Vec<f64>,
    /// Maximum per component.
    pub max: Vec<f64>,
}

impl RunningStats {
    /// Empty statistics for `dim` components.
    pub fn new(dim: usize) -> Self {
        Self {
            count: 0,
            mean: vec![0.0; dim],
            m2: vec![0.0; dim],
            min: vec![f64::INFINITY; dim],
            max: vec![f64::NEG_INFINITY; dim],
        }
    }

    /// Adds one sample (its length must equal the dimension).
    pub fn push(&mut self, x: &[f32]) {
        assert_eq!(
            x.len(),
            self.mean.len(),
            "RunningStats::push: dimension mismatch"
        );
        self.count += 1;
        let n = self.count as f64;
        for (i, &v) in x.iter().enumerate() {
            let v = v as f64;
            let d = v - self.mean[i];
            self.mean[i] += d / n;
            self.m2[i] += d * (v - self.mean[i]);
            self.min[i] = self.min[i].min(v);
            self.max[i] = self.max[i].max(v);
        }
    }

    /// Population standard deviation per component.
    pub fn std(&self) -> Vec<f64> {
        let n = self.count.max(1) as f64;
        self.m2.iter().map(|m| (m / n).sqrt()).collect()
    }
}

/// How a model sees its inputs and outputs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Normalizer {
    /// (x - min) / (max - min) * 2 - 1, into [-1, 1] (Diffusion Policy's choice for actions).
    MinMax {
        /// Lower bound per component.
        min: Vec<f32>,
        /// Upper bound per component.
        max: Vec<f32>,
    },
    /// (x - mean) / std.
    MeanStd {
        /// Mean per component.
        mean: Vec<f32>,
        /// Standard deviation per component.
        std: Vec<f32>,
    },
}

/// Ranges narrower than this are treated as constant (mapped to 0) rather than blown up.
const MIN_RANGE: f32 = 1e-6;

impl Normalizer {
    /// A min-max normaliser from statistics.
    pub fn min_max(stats: &RunningStats) -> Self {
        Self::MinMax {
            min: stats.min.iter().map(|&v| v as f32).collect(),
            max: stats.max.iter().map(|&v| v as f32).collect(),
        }
    }

    /// A mean-std normaliser from statistics.
    pub fn mean_std(stats: &RunningStats) -> Self {
        Self::MeanStd {
            mean: stats.mean.iter().map(|&v| v as f32).collect(),
            std: stats.std().iter().map(|&v| v as f32).collect(),
        }
    }

    /// Dimension.
    pub fn dim(&self) -> usize {
        match self {
            Self::MinMax { min, .. } => min.len(),
            Self::MeanStd { mean, .. } => mean.len(),
        }
    }

    /// Normalises `x` in place.
    pub fn normalize(&self, x: &mut [f32]) {
        match self {
            Self::MinMax { min, max } => {
                for ((v, lo), hi) in x.iter_mut().zip(min).zip(max) {
                    let r = hi - lo;
                    *v = if r < MIN_RANGE {
                        0.0
                    } else {
                        (*v - lo) / r * 2.0 - 1.0
                    };
                }
            }
            Self::MeanStd { mean, std } => {
                for ((v, m), s) in x.iter_mut().zip(mean).zip(std) {
                    *v = (*v - m) / s.max(MIN_RANGE);
                }
            }
        }
    }

    /// Inverse of [`Normalizer::normalize`], in place.
    pub fn denormalize(&self, x: &mut [f32]) {
        match self {
            Self::MinMax { min, max } => {
                for ((v, lo), hi) in x.iter_mut().zip(min).zip(max) {
                    let r = hi - lo;
                    *v = if r < MIN_RANGE {
                        *lo
                    } else {
                        (*v + 1.0) / 2.0 * r + lo
                    };
                }
            }
            Self::MeanStd { mean, std } => {
                for ((v, m), s) in x.iter_mut().zip(mean).zip(std) {
                    *v = *v * s.max(MIN_RANGE) + m;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn welford_matches_two_pass() {
        let xs = [[1.0f32, 10.0], [2.0, 10.0], [4.0, 10.0], [9.0, 10.0]];
        let mut s = RunningStats::new(2);
        xs.iter().for_each(|x| s.push(x));
        assert_eq!(s.count, 4);
        assert!((s.mean[0] - 4.0).abs() < 1e-12);
        let var: f64 = xs.iter().map(|x| (x[0] as f64 - 4.0).powi(2)).sum::<f64>() / 4.0;
        assert!((s.std()[0] - var.sqrt()).abs() < 1e-12);
        assert_eq!((s.min[0], s.max[0]), (1.0, 9.0));
        assert_eq!(s.std()[1], 0.0);
    }

    #[test]
    fn normalizers_round_trip_and_handle_constants() {
        let mut s = RunningStats::new(2);
        s.push(&[0.0, 5.0]);
        s.push(&[512.0, 5.0]);
        for n in [Normalizer::min_max(&s), Normalizer::mean_std(&s)] {
            let mut x = [128.0f32, 5.0];
            n.normalize(&mut x);
            assert!(x.iter().all(|v| v.is_finite()));
            n.denormalize(&mut x);
            assert!(
                (x[0] - 128.0).abs() < 1e-3 && (x[1] - 5.0).abs() < 1e-3,
                "{x:?}"
            );
        }
        let mut x = [512.0f32, 5.0];
        Normalizer::min_max(&s).normalize(&mut x);
        assert_eq!(x, [1.0, 0.0]);
    }
}
