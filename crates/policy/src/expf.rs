//! `exp` over f32 slices in vector registers, bit for bit the `f32::exp` it replaces.
//!
//! `f32::exp` calls the C library's `expf`, one element per call: in a Push-T GRPO iteration
//! the Mish activations' exp, with the loop around the calls, was 8.5% of the CPU time. On x86-64 Linux with glibc (2.28 and later), `expf` on a CPU with
//! AVX2 and FMA is glibc's `__expf_fma`: the algorithm of Arm's optimized-routines (MIT /
//! Apache-2.0; glibc's `sysdeps/ieee754/flt-32/e_expf.c`), evaluated in f64 with fused
//! multiply-adds. [`exp_of`] repeats that evaluation step for step, with the same constants and
//! the same fused operations, in a loop the compiler vectorises, so every result is the library
//! call's to the bit: the trained figures that use it do not move. Inputs off its main path
//! (|x| >= 88, infinities, NaN) take the library call itself. Other targets, and CPUs without
//! AVX2 and FMA (where glibc picks another variant), take the library call for every element.
//! A unit test compares the two over 2^22 inputs spread over the f32 bit patterns, and
//! `exp_matches_the_library_on_every_input` (ignored: `tools/exp_check.sh` runs it) over all
//! 2^32. A glibc older than 2.28 has another
//! `expf`: there the results would differ from the library's in rare last bits (still
//! deterministic), and the sampled test would fail.

/// `exp(arg(v))` for every v of `x`: `arg` is applied first, as the caller would before
/// `f32::exp`.
pub(crate) fn exp_of<F: Fn(f32) -> f32 + Copy>(x: &[f32], arg: F) -> Vec<f32> {
    #[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
    if glibc_fma::usable() {
        return glibc_fma::exp_of(x, arg);
    }
    x.iter().map(|&v| arg(v).exp()).collect()
}

#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
mod glibc_fma {
    /// 32 / ln 2.
    const INV_LN2_N: f64 = f64::from_bits(0x4047_1547_652b_82fe);
    /// 1.5 x 2^52: adding it rounds to an integer, which then sits in the low mantissa bits.
    const SHIFT: f64 = f64::from_bits(0x4338_0000_0000_0000);
    /// The cubic's coefficients, scaled for r = x 32 / ln 2 - k.
    const C: [f64; 3] = [
        f64::from_bits(0x3ebc_6af8_4b91_2394),
        f64::from_bits(0x3f2e_bfce_50fa_c4f3),
        f64::from_bits(0x3f96_2e42_ff0c_52d6),
    ];
    /// 2^(i / 32) for i in 0..32, each as its bits less i << 47, so that adding k << 47 scales
    /// it by 2^(k div 32).
    const T: [u64; 32] = [
        0x3ff0_0000_0000_0000,
        0x3fef_d9b0_d315_8574,
        0x3fef_b558_6cf9_890f,
        0x3fef_9301_d012_5b51,
        0x3fef_72b8_3c7d_517b,
        0x3fef_5487_3168_b9aa,
        0x3fef_387a_6e75_6238,
        0x3fef_1e9d_f51f_dee1,
        0x3fef_06fe_0a31_b715,
        0x3fee_f1a7_373a_a9cb,
        0x3fee_dea6_4c12_3422,
        0x3fee_ce08_6061_892d,
        0x3fee_bfda_d536_2a27,
        0x3fee_b42b_569d_4f82,
        0x3fee_ab07_dd48_5429,
        0x3fee_a47e_b03a_5585,
        0x3fee_a09e_667f_3bcd,
        0x3fee_9f75_e8ec_5f74,
        0x3fee_a114_73eb_0187,
        0x3fee_a589_994c_ce13,
        0x3fee_ace5_422a_a0db,
        0x3fee_b737_b0cd_c5e5,
        0x3fee_c491_82a3_f090,
        0x3fee_d503_b23e_255d,
        0x3fee_e89f_995a_d3ad,
        0x3fee_ff76_f2fb_5e47,
        0x3fef_199b_dd85_529c,
        0x3fef_3720_dcef_9069,
        0x3fef_5818_dcfb_a487,
        0x3fef_7c97_337b_9b5f,
        0x3fef_a4af_a2a4_90da,
        0x3fef_d076_5b6e_4540,
    ];

    /// Whether glibc's `expf` is its FMA variant here: the CPU has AVX2 and FMA, the condition
    /// of glibc's dispatch.
    pub(super) fn usable() -> bool {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }

    pub(super) fn exp_of<F: Fn(f32) -> f32 + Copy>(x: &[f32], arg: F) -> Vec<f32> {
        exp_with(x, arg, std::arch::is_x86_feature_detected!("avx512f"))
    }

    /// [`exp_of`] in 512-bit registers when `wide` (which needs AVX-512F), else in 256-bit.
    pub(super) fn exp_with<F: Fn(f32) -> f32 + Copy>(x: &[f32], arg: F, wide: bool) -> Vec<f32> {
        assert!(
            usable() && (!wide || std::arch::is_x86_feature_detected!("avx512f")),
            "exp_with: the CPU lacks the features of the variant asked for"
        );
        let mut out = vec![0.0f32; x.len()];
        // SAFETY: the assertion above checked that the CPU has AVX2 and FMA, and AVX-512F where
        // `wide`: the features each function is compiled for. Both read and write only through
        // the two slices.
        #[allow(unsafe_code)]
        let off_path = if wide {
            unsafe { main_path_avx512(x, &mut out, arg) }
        } else {
            unsafe { main_path_avx2(x, &mut out, arg) }
        };
        if off_path {
            for (o, &v) in out.iter_mut().zip(x) {
                let a = arg(v);
                if off_main_path(a) {
                    *o = a.exp();
                }
            }
        }
        out
    }

    /// |x| >= 88 (glibc's special cases and the range where its result over- or underflows),
    /// infinities and NaN: glibc's own test, on the exponent bits.
    #[inline]
    fn off_main_path(x: f32) -> bool {
        (x.to_bits() >> 20) & 0x7ff >= 0x42a
    }

    /// [`main_path`] in 256-bit registers.
    #[target_feature(enable = "avx2,fma")]
    fn main_path_avx2<F: Fn(f32) -> f32 + Copy>(x: &[f32], out: &mut [f32], arg: F) -> bool {
        main_path(x, out, arg)
    }

    /// [`main_path`] in 512-bit registers: the same operations, twice the elements at a time.
    #[target_feature(enable = "avx512f,avx2,fma")]
    fn main_path_avx512<F: Fn(f32) -> f32 + Copy>(x: &[f32], out: &mut [f32], arg: F) -> bool {
        main_path(x, out, arg)
    }

    /// glibc's main path, operation for operation; each `mul_add` is one of `__expf_fma`'s
    /// fused multiply-adds (`vfmadd`/`vfmsub`), each other operation one rounding in f64.
    /// Returns whether any input is off that path (its result then needs the library call).
    /// Inlined into the two functions above, which compile it for their registers.
    #[inline(always)]
    fn main_path<F: Fn(f32) -> f32 + Copy>(x: &[f32], out: &mut [f32], arg: F) -> bool {
        let mut off = false;
        for (o, &v) in out.iter_mut().zip(x) {
            let a = arg(v);
            off |= off_main_path(a);
            let xd = f64::from(a);
            // x 32 / ln 2 = k + r, k an integer, |r| <= 1/2.
            let shifted = INV_LN2_N.mul_add(xd, SHIFT);
            let ki = shifted.to_bits();
            let kd = shifted - SHIFT;
            let r = INV_LN2_N.mul_add(xd, -kd);
            // 2^(k / 32) from the table and the exponent bits.
            let s = f64::from_bits(T[(ki % 32) as usize].wrapping_add(ki << 47));
            let z = C[0].mul_add(r, C[1]);
            let r2 = r * r;
            let y = C[2].mul_add(r, 1.0);
            let y = z.mul_add(r2, y);
            *o = (y * s) as f32;
        }
        off
    }
}

#[cfg(test)]
mod tests {
    use super::exp_of;

    /// [`exp_of`], and on x86-64 Linux each register width the CPU has, against the library.
    fn check(bits: impl Iterator<Item = u32>) {
        let x: Vec<f32> = bits.map(f32::from_bits).collect();
        #[allow(unused_mut)]
        let mut results = vec![exp_of(&x, |v| v)];
        #[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
        if super::glibc_fma::usable() {
            results.push(super::glibc_fma::exp_with(&x, |v| v, false));
            if std::arch::is_x86_feature_detected!("avx512f") {
                results.push(super::glibc_fma::exp_with(&x, |v| v, true));
            }
        }
        for ours in results {
            for (&v, &e) in x.iter().zip(&ours) {
                let want = v.exp();
                assert!(
                    e.to_bits() == want.to_bits() || (e.is_nan() && want.is_nan()),
                    "exp({v:e}) = {e:e}, the library gives {want:e}"
                );
            }
        }
    }

    /// Every 1,024th bit pattern, offset so that both signs, zeros, subnormals, the 88 and 104
    /// thresholds, infinities and NaN are among them, plus dense runs around 1 and the cap of
    /// Mish (20).
    #[test]
    fn exp_matches_the_library() {
        check((0..1u32 << 22).map(|i| (i << 10) | (i % 1021)));
        check((0..1u32 << 16).map(|i| 0x3f80_0000 - (1 << 15) + i));
        check((0..1u32 << 16).map(|i| 20f32.to_bits() - (1 << 15) + i));
        check(
            [
                0,
                0x8000_0000,
                0x7f80_0000,
                0xff80_0000,
                0x7fc0_0000,
                0xffc0_0001,
            ]
            .into_iter(),
        );
        // An argument map is applied before exp, as in Mish.
        let x = [-1.0f32, 0.5, 30.0];
        let got = exp_of(&x, |v| v.min(20.0));
        assert_eq!(got[2].to_bits(), 20f32.exp().to_bits());
    }

    #[test]
    #[ignore = "every f32, each register width: about two minutes in release"]
    fn exp_matches_the_library_on_every_input() {
        for hi in 0..256u32 {
            check((0..1u32 << 24).map(|lo| (hi << 24) | lo));
        }
    }
}
