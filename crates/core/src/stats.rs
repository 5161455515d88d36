//! The statistics reports quote, written once: binomial intervals for success rates, the exact
//! McNemar test and a normal interval for paired comparisons of two policies on the same seeded
//! episodes, and order-statistic quantiles. Pure functions on numbers; callers decide what pairs
//! up.

/// The two-sided standard-normal quantile for 95% intervals, as the reports round it.
pub const Z95: f64 = 1.96;

/// Wilson score interval for a binomial proportion (95% with `z = 1.96`).
///
/// With `p = k / n`:
/// `(p + z²/2n ± z·sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n)`, clamped to [0, 1];
/// `(0, 1)` when `n = 0` (nothing observed).
pub fn wilson_interval(successes: usize, n: usize, z: f64) -> (f64, f64) {
    if n == 0 {
        return (0.0, 1.0);
    }
    let n_f = n as f64;
    let p = successes as f64 / n_f;
    let z2 = z * z;
    let denom = 1.0 + z2 / n_f;
    let centre = (p + z2 / (2.0 * n_f)) / denom;
    let half = z * (p * (1.0 - p) / n_f + z2 / (4.0 * n_f * n_f)).sqrt() / denom;
    ((centre - half).max(0.0), (centre + half).min(1.0))
}

/// Exact (binomial) McNemar test on paired successes: the two-sided p-value given the
/// discordant pairs `only_a` (solved by A alone) and `only_b` (solved by B alone).
///
/// With `n = only_a + only_b` and `X ~ Binomial(n, 1/2)`:
/// `p = min(1, 2 · P(X <= min(only_a, only_b)))`, each term `C(n, k) / 2^n` computed in logs
/// so large `n` stays finite; `p = 1` when there are no discordant pairs.
pub fn mcnemar_exact(only_a: usize, only_b: usize) -> f64 {
    let n = only_a + only_b;
    let ln_choose = |n: usize, k: usize| -> f64 {
        (1..=k)
            .map(|i| ((n + 1 - i) as f64).ln() - (i as f64).ln())
            .sum()
    };
    let tail: f64 = (0..=only_a.min(only_b))
        .map(|k| (ln_choose(n, k) - n as f64 * std::f64::consts::LN_2).exp())
        .sum();
    (2.0 * tail).min(1.0)
}

/// Mean of paired differences `d_i` with the half-width of its normal interval:
/// `(mean d, z · s / sqrt(n))` where `s² = Σ (d_i - mean)² / (n - 1)` (sample variance).
/// None below two differences (no variance).
pub fn paired_mean_interval(differences: &[f64], z: f64) -> Option<(f64, f64)> {
    let n = differences.len();
    if n < 2 {
        return None;
    }
    let mean = differences.iter().sum::<f64>() / n as f64;
    let var = differences.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    Some((mean, z * (var / n as f64).sqrt()))
}

/// Nearest-rank quantile of sorted values: `sorted[round((n - 1) · q)]` (no interpolation, so
/// the median of an even count is the upper middle value); None when empty.
pub fn nearest_rank_quantile(sorted: &[f64], q: f64) -> Option<f64> {
    let last = sorted.len().checked_sub(1)?;
    sorted.get((last as f64 * q).round() as usize).copied()
}

/// Linear-interpolation quantile of sorted values (numpy's default): with `pos = q · (n - 1)`,
/// `sorted[floor] + (sorted[ceil] - sorted[floor]) · (pos - floor)`; None when empty.
pub fn linear_quantile(sorted: &[f64], q: f64) -> Option<f64> {
    let last = sorted.len().checked_sub(1)?;
    let pos = q * last as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    Some(sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wilson_matches_reference_values() {
        // Reference: statsmodels proportion_confint(8, 10, method="wilson") = (0.4902, 0.9433).
        let (lo, hi) = wilson_interval(8, 10, 1.959964);
        assert!(
            (lo - 0.4902).abs() < 1e-3 && (hi - 0.9433).abs() < 1e-3,
            "{lo} {hi}"
        );
        let (lo, hi) = wilson_interval(0, 20, 1.959964);
        assert!(lo == 0.0 && (hi - 0.1611).abs() < 1e-3, "{hi}");
        assert_eq!(wilson_interval(0, 0, Z95), (0.0, 1.0));
    }

    #[test]
    fn mcnemar_matches_the_exact_binomial_test() {
        // 12 episodes only one policy solved, 4 only the other: scipy's
        // binomtest(4, 16, 0.5).pvalue = 0.076812744140625.
        let p = mcnemar_exact(12, 4);
        assert!((p - 0.076812744140625).abs() < 1e-12, "{p}");
        assert_eq!(mcnemar_exact(4, 12), p, "symmetric");
        assert_eq!(mcnemar_exact(0, 0), 1.0);
    }

    #[test]
    fn paired_interval_of_constant_differences_is_a_point() {
        let (m, h) = paired_mean_interval(&[0.1, 0.1, 0.1], Z95).unwrap();
        assert!((m - 0.1).abs() < 1e-12 && h < 1e-12, "{m} {h}");
        // d = 1, 2, 3: mean 2, s = 1, half-width 1.96 / sqrt(3).
        let (m, h) = paired_mean_interval(&[1.0, 2.0, 3.0], Z95).unwrap();
        assert!((m - 2.0).abs() < 1e-12 && (h - 1.96 / 3f64.sqrt()).abs() < 1e-12);
        assert!(paired_mean_interval(&[1.0], Z95).is_none());
    }

    #[test]
    fn quantiles_of_order_statistics() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(nearest_rank_quantile(&v, 0.5), Some(3.0));
        assert_eq!(nearest_rank_quantile(&v, 0.0), Some(1.0));
        assert_eq!(nearest_rank_quantile(&v, 1.0), Some(4.0));
        assert_eq!(nearest_rank_quantile(&[], 0.5), None);
        // numpy.quantile([1, 2, 3, 4], 0.5) = 2.5, 0.9 -> 3.7.
        assert_eq!(linear_quantile(&v, 0.5), Some(2.5));
        assert!((linear_quantile(&v, 0.9).unwrap() - 3.7).abs() < 1e-12);
        assert_eq!(linear_quantile(&[], 0.5), None);
    }
}
