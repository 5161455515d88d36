//! Reward-model quality metrics (docs/algorithms.md §4): value-order correlation (VOC), pairwise
//! preference accuracy, success-detection AUROC and monotonicity.

use serde::{Deserialize, Serialize};

/// Average ranks (1-based), ties sharing the mean of their ranks.
fn ranks(v: &[f64]) -> Vec<f64> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| v[a].total_cmp(&v[b]));
    let mut r = vec![0.0; v.len()];
    let mut i = 0;
    while i < idx.len() {
        let mut j = i;
        while j + 1 < idx.len() && v[idx[j + 1]] == v[idx[i]] {
            j += 1;
        }
        let avg = (i + j) as f64 / 2.0 + 1.0;
        for &k in &idx[i..=j] {
            r[k] = avg;
        }
        i = j + 1;
    }
    r
}

/// Pearson correlation; None when either side is constant, the lengths differ or there are
/// fewer than 2 points.
pub fn pearson(x: &[f64], y: &[f64]) -> Option<f64> {
    if x.len() != y.len() || x.len() < 2 {
        return None;
    }
    let n = x.len() as f64;
    let (mx, my) = (x.iter().sum::<f64>() / n, y.iter().sum::<f64>() / n);
    let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
    for (a, b) in x.iter().zip(y) {
        sxy += (a - mx) * (b - my);
        sxx += (a - mx) * (a - mx);
        syy += (b - my) * (b - my);
    }
    (sxx > 0.0 && syy > 0.0).then(|| sxy / (sxx * syy).sqrt())
}

/// Spearman's rank correlation (Pearson correlation of average ranks); None when either side
/// is constant or fewer than 2 points.
pub fn spearman(x: &[f64], y: &[f64]) -> Option<f64> {
    if x.len() != y.len() || x.len() < 2 {
        return None;
    }
    pearson(&ranks(x), &ranks(y))
}

/// VOC: Spearman rho between predicted progress and time, averaged over trajectories
/// (trajectories with constant predictions count as 0).
pub fn voc(progress: &[Vec<f64>]) -> f64 {
    let per: Vec<f64> = progress
        .iter()
        .filter(|p| p.len() >= 2)
        .map(|p| {
            let t: Vec<f64> = (0..p.len()).map(|i| i as f64).collect();
            spearman(p, &t).unwrap_or(0.0)
        })
        .collect();
    if per.is_empty() {
        0.0
    } else {
        per.iter().sum::<f64>() / per.len() as f64
    }
}

/// Fraction of consecutive steps whose progress does not decrease by more than `tol`.
pub fn monotonicity(progress: &[Vec<f64>], tol: f64) -> f64 {
    let (mut ok, mut n) = (0usize, 0usize);
    for p in progress {
        for w in p.windows(2) {
            n += 1;
            ok += usize::from(w[1] >= w[0] - tol);
        }
    }
    if n == 0 { 1.0 } else { ok as f64 / n as f64 }
}

/// Area under the ROC curve of `scores` separating positives from negatives (ties count 1/2);
/// None without both classes.
pub fn auroc(scores: &[f64], positive: &[bool]) -> Option<f64> {
    let pos: Vec<f64> = scores
        .iter()
        .zip(positive)
        .filter(|p| *p.1)
        .map(|p| *p.0)
        .collect();
    let neg: Vec<f64> = scores
        .iter()
        .zip(positive)
        .filter(|p| !*p.1)
        .map(|p| *p.0)
        .collect();
    if pos.is_empty() || neg.is_empty() {
        return None;
    }
    let mut wins = 0.0;
    for p in &pos {
        for q in &neg {
            wins += if p > q {
                1.0
            } else if p == q {
                0.5
            } else {
                0.0
            };
        }
    }
    Some(wins / (pos.len() * neg.len()) as f64)
}

/// Pairwise preference accuracy: the fraction of (preferred, other) score pairs ordered
/// correctly (ties count 1/2).
pub fn pairwise_accuracy(pairs: &[(f64, f64)]) -> Option<f64> {
    if pairs.is_empty() {
        return None;
    }
    let correct: f64 = pairs
        .iter()
        .map(|(a, b)| {
            if a > b {
                1.0
            } else if a == b {
                0.5
            } else {
                0.0
            }
        })
        .sum();
    Some(correct / pairs.len() as f64)
}

/// The metrics `diffrl reward eval` reports.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RewardMetrics {
    /// Mean Spearman rho of progress vs time over successful trajectories.
    pub voc: f64,
    /// Successful trajectories VOC was computed on.
    pub voc_trajectories: usize,
    /// Success-vs-failure pairs of equal length ordered correctly by final progress.
    pub pairwise_accuracy: Option<f64>,
    /// Pairs compared.
    pub pairs: usize,
    /// AUROC of final progress as a success detector.
    pub success_auroc: Option<f64>,
    /// Fraction of non-decreasing steps on successful trajectories (tolerance 0.01).
    pub monotonicity: f64,
    /// Predictions outside [0, 1] that were clamped.
    pub clamped: usize,
}

impl RewardMetrics {
    /// (VOC, monotonicity), or None when no successful trajectory measured them: `voc` and
    /// `monotonicity` then hold placeholders (0 and 1), not measurements.
    pub fn voc_measured(&self) -> Option<(f64, f64)> {
        (self.voc_trajectories > 0).then_some((self.voc, self.monotonicity))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spearman_hand_cases() {
        let x = [1.0, 2.0, 3.0, 4.0];
        assert!((spearman(&x, &[10.0, 20.0, 30.0, 40.0]).unwrap() - 1.0).abs() < 1e-12);
        assert!((spearman(&x, &[4.0, 3.0, 2.0, 1.0]).unwrap() + 1.0).abs() < 1e-12);
        // Ties share ranks: y ranks (1.5, 1.5, 3, 4) -> rho = 0.9486833.
        let rho = spearman(&x, &[1.0, 1.0, 2.0, 3.0]).unwrap();
        assert!((rho - 0.948_683_298).abs() < 1e-6, "{rho}");
        assert_eq!(spearman(&x, &[1.0; 4]), None);
    }

    #[test]
    fn voc_monotonicity_auroc_pairs() {
        assert!((voc(&[vec![0.0, 0.5, 1.0], vec![1.0, 0.5, 0.0]]) - 0.0).abs() < 1e-12);
        assert!((voc(&[vec![0.1, 0.2, 0.9]]) - 1.0).abs() < 1e-12);
        assert_eq!(monotonicity(&[vec![0.0, 0.5, 0.4, 1.0]], 0.0), 2.0 / 3.0);
        assert_eq!(monotonicity(&[vec![0.0, 0.5, 0.495]], 0.01), 1.0);
        assert_eq!(
            auroc(&[0.9, 0.8, 0.1, 0.2], &[true, true, false, false]),
            Some(1.0)
        );
        assert_eq!(auroc(&[0.5, 0.5], &[true, false]), Some(0.5));
        assert_eq!(auroc(&[0.5], &[true]), None);
        assert_eq!(
            pairwise_accuracy(&[(1.0, 0.0), (0.0, 1.0), (1.0, 1.0), (2.0, 1.0)]),
            Some(0.625)
        );
        assert_eq!(pairwise_accuracy(&[]), None);
    }
}
