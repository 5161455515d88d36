//! `tanh` over f32 slices in vector registers, bit for bit the `f32::tanh` it replaces.
//!
//! `f32::tanh` calls the C library's `tanhf`, one element per call. The patch encoder's keypoint
//! read-out takes the tanh of 2 x 32 offsets per patch and image (262,144 values in a batch of
//! 64), and Burn computes it again in the backward pass: with the `expm1f` it calls, about a
//! tenth of a VLA BC step on one thread (docs/vla.md, "Speed against PyTorch"). glibc's `tanhf`
//! on x86-64 (2.28 to 2.36 at least, every CPU: no FMA variant) is the fdlibm algorithm
//! (Sun Microsystems' freely redistributable libm, glibc's `sysdeps/ieee754/flt-32/s_tanhf.c`
//! and `s_expm1f.c`): t = expm1(2|x|), tanh = 1 - 2 / (t + 2) for |x| >= 1, and t =
//! expm1(-2|x|), tanh = -t / (t + 2) below, in f32 arithmetic without fused operations.
//! [`tanh_of`] repeats that evaluation step for step, every branch of `expm1f` computed and the
//! right one selected, in a loop the compiler vectorises; inputs off its main path (|x| >= 22,
//! |x| < 2^-55, infinities, NaN) take the library call itself.
//!
//! Whether the C library is that one is checked once per process: the vectorised function
//! must give the library's bits on probe inputs that include values where fdlibm's result is
//! not the correctly rounded one (a correctly rounding `tanhf`, as newer C libraries have,
//! gives other bits there). Elsewhere (another library, another target, a CPU without AVX2 and
//! FMA) every element takes the library call, so the results are the library's in every case.
//! A unit test compares the two over 2^22 inputs spread over the f32 bit patterns, and
//! `tanh_matches_the_library_on_every_input` (ignored: `tools/exp_check.sh` runs it) over all
//! 2^32.

/// `tanh(v)` for every v of `x`.
pub(crate) fn tanh_of(x: &[f32]) -> Vec<f32> {
    #[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
    if fdlibm::usable() {
        return fdlibm::tanh_with(x, std::arch::is_x86_feature_detected!("avx512f"));
    }
    x.iter().map(|&v| v.tanh()).collect()
}

#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
mod fdlibm {
    use std::sync::OnceLock;

    /// ln 2 in two parts: the high part has trailing zeros, so k ln2_hi is exact for |k| < 2^8.
    const LN2_HI: f32 = f32::from_bits(0x3f31_7180);
    const LN2_LO: f32 = f32::from_bits(0x3717_f7d1);
    const INV_LN2: f32 = f32::from_bits(0x3fb8_aa3b);
    /// expm1's scaled rational-approximation coefficients.
    const Q: [f32; 5] = [
        f32::from_bits(0xbd08_8889),
        f32::from_bits(0x3ad0_0d01),
        f32::from_bits(0xb8a6_70cd),
        f32::from_bits(0x3686_7e54),
        f32::from_bits(0xb457_edbb),
    ];

    /// Inputs at which fdlibm's `tanhf` is not correctly rounded (found by comparing it with
    /// the f64 tanh over every f32 in [2^-12, 22)): a correctly rounding library differs
    /// there.
    /// (A quarter of the inputs there are such.)
    pub(super) const NOT_CORRECTLY_ROUNDED: [u32; 8] = [
        0x3980_0eab, // 2.442499e-4
        0x3a86_012e, // 1.022374e-3
        0x3b8c_006c, // 4.272511e-3
        0x3c92_0015, // 1.7822305e-2
        0x3d98_0000, // 7.421875e-2
        0x3e9e_0000, // 3.0859375e-1
        0x3fa4_000e, // 1.2812517
        0x40aa_7496, // 5.3267317
    ];

    /// Whether the vectorised evaluation gives the library's bits here: the CPU has AVX2 and
    /// FMA (the registers the loops are compiled for), and the library's `tanhf` is fdlibm's
    /// (checked once on the probe inputs).
    pub(super) fn usable() -> bool {
        static USABLE: OnceLock<bool> = OnceLock::new();
        *USABLE.get_or_init(|| {
            if !(std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma"))
            {
                return false;
            }
            let probes = probe_inputs();
            let wide = std::arch::is_x86_feature_detected!("avx512f");
            [false, wide].iter().all(|&w| {
                tanh_with(&probes, w)
                    .iter()
                    .zip(&probes)
                    .all(|(y, x)| y.to_bits() == x.tanh().to_bits())
            })
        })
    }

    /// 4,096 inputs spread over the main path (both signs, both of `tanhf`'s branches, each of
    /// `expm1f`'s), and the inputs where fdlibm is not correctly rounded.
    fn probe_inputs() -> Vec<f32> {
        let lo = 0x3000_0000u32; // 2^-31
        let hi = 0x41b0_0000u32; // 22
        let step = (hi - lo) / 2048;
        (0..2048u32)
            .map(|i| lo + i * step + (i * 7919) % step)
            .flat_map(|b| [f32::from_bits(b), -f32::from_bits(b)])
            .chain(NOT_CORRECTLY_ROUNDED.iter().map(|&b| f32::from_bits(b)))
            .collect()
    }

    /// [`super::tanh_of`] in 512-bit registers when `wide` (which needs AVX-512F), else in
    /// 256-bit.
    pub(super) fn tanh_with(x: &[f32], wide: bool) -> Vec<f32> {
        assert!(
            std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && (!wide || std::arch::is_x86_feature_detected!("avx512f")),
            "tanh_with: the CPU lacks the features of the variant asked for"
        );
        let mut out = vec![0.0f32; x.len()];
        // SAFETY: the assertion above checked that the CPU has AVX2 and FMA, and AVX-512F where
        // `wide`: the features each function is compiled for. Both read and write only through
        // the two slices.
        #[allow(unsafe_code)]
        let off_path = if wide {
            unsafe { main_path_avx512(x, &mut out) }
        } else {
            unsafe { main_path_avx2(x, &mut out) }
        };
        if off_path {
            for (o, &v) in out.iter_mut().zip(x) {
                if off_main_path(v) {
                    *o = v.tanh();
                }
            }
        }
        out
    }

    /// |x| >= 22 (tanh is +-1 in f32), |x| < 2^-55 (tanh is x), infinities and NaN: fdlibm's own
    /// tests, on the bits.
    #[inline]
    fn off_main_path(x: f32) -> bool {
        !(0x2400_0000..0x41b0_0000).contains(&(x.to_bits() & 0x7fff_ffff))
    }

    /// [`main_path`] in 256-bit registers.
    #[target_feature(enable = "avx2,fma")]
    fn main_path_avx2(x: &[f32], out: &mut [f32]) -> bool {
        main_path(x, out)
    }

    /// [`main_path`] in 512-bit registers: the same operations, twice the elements at a time.
    #[target_feature(enable = "avx512f,avx2,fma")]
    fn main_path_avx512(x: &[f32], out: &mut [f32]) -> bool {
        main_path(x, out)
    }

    /// fdlibm's `tanhf` on its main path, operation for operation. Returns whether any input is
    /// off that path (its result then needs the library call). Inlined into the two functions
    /// above, which compile it for their registers.
    #[inline(always)]
    fn main_path(x: &[f32], out: &mut [f32]) -> bool {
        let mut off = false;
        for (o, &v) in out.iter_mut().zip(x) {
            off |= off_main_path(v);
            let bits = v.to_bits();
            let ax = f32::from_bits(bits & 0x7fff_ffff);
            let large = ax >= 1.0;
            let t = expm1(if large { 2.0 * ax } else { -2.0 * ax });
            let z = if large {
                1.0 - 2.0 / (t + 2.0)
            } else {
                -t / (t + 2.0)
            };
            *o = f32::from_bits(z.to_bits() | (bits & 0x8000_0000));
        }
        off
    }

    /// fdlibm's `expm1f` for |a| < 88 (finite, no overflow), every branch evaluated and the
    /// one the library takes selected, so that the loop has no jumps.
    #[inline(always)]
    fn expm1(a: f32) -> f32 {
        let bits = a.to_bits();
        let hx = bits & 0x7fff_ffff;
        let neg = bits >> 31 != 0;
        // Argument reduction a = k ln2 + x + c, |x| <= ln2 / 2: k = +-1 for 0.5 ln2 < |a| <
        // 1.5 ln2, else k = round(a / ln2) (C's truncation of a / ln2 +- 0.5).
        // max and min, not clamp: clamp keeps a NaN, which the conversion below must not see.
        #[allow(clippy::manual_clamp)]
        let kf = (INV_LN2 * a + if neg { -0.5 } else { 0.5 })
            .max(-128.0)
            .min(128.0);
        // SAFETY: kf is finite and within i32's range (clamped above; NaN becomes -128).
        #[allow(unsafe_code)]
        let k_round: i32 = unsafe { kf.to_int_unchecked() };
        let t = k_round as f32;
        let one_ln2 = hx < 0x3f85_1592;
        let (k, hi, lo) = if one_ln2 {
            if neg {
                (-1, a + LN2_HI, -LN2_LO)
            } else {
                (1, a - LN2_HI, LN2_LO)
            }
        } else {
            (k_round, a - t * LN2_HI, t * LN2_LO)
        };
        let reduced = hi - lo;
        let reduce = hx > 0x3eb1_7218;
        let k = if reduce { k } else { 0 };
        let x = if reduce { reduced } else { a };
        let c = if reduce { (hi - reduced) - lo } else { 0.0 };
        // expm1 of the reduced argument by the rational approximation.
        let hfx = 0.5 * x;
        let hxs = x * hfx;
        let r1 = 1.0 + hxs * (Q[0] + hxs * (Q[1] + hxs * (Q[2] + hxs * (Q[3] + hxs * Q[4]))));
        let t = 3.0 - r1 * hfx;
        let e = hxs * ((r1 - t) / (6.0 - x * t));
        let k0 = x - (x * e - hxs);
        let e = (x * (e - c) - c) - hxs;
        let k_minus_1 = 0.5 * (x - e) - 0.5;
        let k_1 = if x < -0.25 {
            -2.0 * (e - (x + 0.5))
        } else {
            1.0 + 2.0 * (x - e)
        };
        // Scaling by 2^k: k added to the exponent bits.
        let scale = |y: f32| f32::from_bits(y.to_bits().wrapping_add((k << 23) as u32));
        let far = scale(1.0 - (e - x)) - 1.0;
        let below_23 = scale(
            f32::from_bits(0x3f80_0000u32.wrapping_sub(0x0100_0000u32.wrapping_shr(k as u32)))
                - (e - x),
        );
        let from_23 = scale((x - (e + f32::from_bits(((0x7f - k) << 23) as u32))) + 1.0);
        let y = match k {
            0 => k0,
            -1 => k_minus_1,
            1 => k_1,
            k if k <= -2 || k > 56 => far,
            k if k < 23 => below_23,
            _ => from_23,
        };
        // |a| < 2^-25: expm1 is a.
        if hx < 0x3300_0000 { a } else { y }
    }
}

#[cfg(test)]
mod tests {
    use super::tanh_of;

    /// [`tanh_of`], and on x86-64 Linux each register width the CPU has, against the library.
    fn check(bits: impl Iterator<Item = u32>) {
        let x: Vec<f32> = bits.map(f32::from_bits).collect();
        #[allow(unused_mut)]
        let mut results = vec![tanh_of(&x)];
        #[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
        if super::fdlibm::usable() {
            results.push(super::fdlibm::tanh_with(&x, false));
            if std::arch::is_x86_feature_detected!("avx512f") {
                results.push(super::fdlibm::tanh_with(&x, true));
            }
        }
        for ours in results {
            for (&v, &e) in x.iter().zip(&ours) {
                let want = v.tanh();
                assert!(
                    e.to_bits() == want.to_bits() || (e.is_nan() && want.is_nan()),
                    "tanh({v:e}) = {e:e}, the library gives {want:e}"
                );
            }
        }
    }

    /// The vectorised evaluation is in use where the suite runs (x86-64 Linux with glibc: CI
    /// and the development machines), so the comparisons below test it, not the library
    /// against itself.
    #[test]
    #[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
    fn the_vectorised_tanh_is_used_here() {
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            assert!(super::fdlibm::usable());
        }
    }

    /// Every 1,024th bit pattern, offset so that both signs, zeros, subnormals, the 2^-55, 1
    /// and 22 thresholds, infinities and NaN are among them, plus dense runs around 1 and
    /// around 0.5 ln 2 and 1.5 ln 2 (the thresholds of expm1 at 2|x|), and the probes.
    #[test]
    fn tanh_matches_the_library() {
        check((0..1u32 << 22).map(|i| (i << 10) | (i % 1021)));
        for centre in [1.0f32, 0.173_286_8, 0.519_860_4, 22.0] {
            check((0..1u32 << 16).map(|i| centre.to_bits() - (1 << 15) + i));
        }
        check(
            [
                0,
                0x8000_0000,
                0x2400_0000,
                0x23ff_ffff,
                0x7f80_0000,
                0xff80_0000,
                0x7fc0_0000,
                0xffc0_0001,
            ]
            .into_iter(),
        );
        #[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
        check(super::fdlibm::NOT_CORRECTLY_ROUNDED.into_iter());
    }

    #[test]
    #[ignore = "every f32, each register width: about three minutes in release"]
    fn tanh_matches_the_library_on_every_input() {
        for hi in 0..256u32 {
            check((0..1u32 << 24).map(|lo| (hi << 24) | lo));
        }
    }
}
