//! `erf` over f32 slices in vector registers, bit for bit the `libm::erff` it replaces.
//!
//! GELU's forward pass takes erf(x / sqrt 2) of every element; the `libm` crate's `erff` (a
//! port of FreeBSD's `s_erff.c`, from Sun Microsystems' freely redistributable fdlibm) is a
//! scalar function with five ranges, two of which call its `expf` twice: in a VLA BC step on
//! one thread about 3% of the samples were the patch encoder's GELU calling it (docs/policy.md,
//! "tanh and erf in vector registers"). [`erf_of`] evaluates the same rational approximations
//! and the same `expf` (FreeBSD's `e_expf.c`, as the `libm` crate has it), operation for
//! operation in f32, in loops the compiler vectorises: every element takes the first range
//! (|x| < 0.84375, where most of a network's inputs lie), and the others are gathered into a
//! loop that computes every range and selects the one `erff` takes; |x| >= 6 (where erf is +-1
//! in f32), infinities and NaN take `libm::erff` itself. `libm` is pinned (`=0.2.16`), so the
//! function compared against is fixed: a unit test compares the two over 2^22 inputs spread
//! over the f32 bit patterns and dense runs around each range's threshold, and
//! `erf_matches_libm_on_every_input` (ignored: `tools/exp_check.sh` runs it) over all 2^32 at
//! each register width. CPUs without AVX2 and FMA take `libm::erff` for every element.

/// `erf(arg(v))` for every v of `x`: `arg` is applied first, as the caller would before
/// `libm::erff`.
pub(crate) fn erf_of<F: Fn(f32) -> f32 + Copy>(x: &[f32], arg: F) -> Vec<f32> {
    #[cfg(target_arch = "x86_64")]
    if vector::usable() {
        return vector::erf_with(x, arg, std::arch::is_x86_feature_detected!("avx512f"));
    }
    x.iter().map(|&v| libm::erff(arg(v))).collect()
}

#[cfg(target_arch = "x86_64")]
mod vector {
    /// erf(1) rounded, less the part of erfc's approximation on [0.84375, 1.25).
    const ERX: f32 = f32::from_bits(0x3f58_560b);
    /// 8 (2 / sqrt(pi) - 1): erf(x) = x + x EFX8 / 8 for |x| < 2^-28.
    const EFX8: f32 = f32::from_bits(0x3f83_75d4);
    /// erf on [0, 0.84375): x + x PP(x^2) / QQ(x^2).
    const PP: [f32; 5] = [
        f32::from_bits(0x3e03_75d4),
        f32::from_bits(0xbea6_6beb),
        f32::from_bits(0xbce9_528f),
        f32::from_bits(0xbbbd_1489),
        f32::from_bits(0xb7c7_56b1),
    ];
    const QQ: [f32; 5] = [
        f32::from_bits(0x3ecb_bbce),
        f32::from_bits(0x3d85_2a63),
        f32::from_bits(0x3ba6_8116),
        f32::from_bits(0x390a_ee49),
        f32::from_bits(0xb684_e21a),
    ];
    /// erf on [0.84375, 1.25): 1 - ERX - PA(|x| - 1) / QA(|x| - 1) (the sign applied after).
    const PA: [f32; 7] = [
        f32::from_bits(0xbb1a_cdc6),
        f32::from_bits(0x3ed4_6805),
        f32::from_bits(0xbebe_9208),
        f32::from_bits(0x3ea2_fe54),
        f32::from_bits(0xbde3_1cc2),
        f32::from_bits(0x3d11_51b3),
        f32::from_bits(0xbb0d_f9c0),
    ];
    const QA: [f32; 6] = [
        f32::from_bits(0x3dd9_f331),
        f32::from_bits(0x3f0a_5785),
        f32::from_bits(0x3d93_1ae7),
        f32::from_bits(0x3e01_3307),
        f32::from_bits(0x3c5f_6e13),
        f32::from_bits(0x3c44_5aa3),
    ];
    /// erfc on [1.25, 1 / 0.35) and [1 / 0.35, 6): exp(-z^2 - 0.5625) exp((z - x)(z + x) +
    /// R(1 / x^2) / S(1 / x^2)) / x, z = x with its 13 low mantissa bits cleared.
    const RA: [f32; 8] = [
        f32::from_bits(0xbc21_a093),
        f32::from_bits(0xbf31_a0b7),
        f32::from_bits(0xc128_f022),
        f32::from_bits(0xc279_8057),
        f32::from_bits(0xc322_658c),
        f32::from_bits(0xc338_9ae7),
        f32::from_bits(0xc2a2_932b),
        f32::from_bits(0xc11d_077e),
    ];
    const SA: [f32; 8] = [
        f32::from_bits(0x419d_35ce),
        f32::from_bits(0x4309_a863),
        f32::from_bits(0x43d9_486f),
        f32::from_bits(0x4421_58c9),
        f32::from_bits(0x43d6_810b),
        f32::from_bits(0x42d9_451f),
        f32::from_bits(0x40d2_3f7c),
        f32::from_bits(0xbd77_7f97),
    ];
    const RB: [f32; 7] = [
        f32::from_bits(0xbc21_a092),
        f32::from_bits(0xbf4c_9dd4),
        f32::from_bits(0xc18e_104b),
        f32::from_bits(0xc320_a2ea),
        f32::from_bits(0xc41f_6441),
        f32::from_bits(0xc480_230b),
        f32::from_bits(0xc3f1_c275),
    ];
    const SB: [f32; 7] = [
        f32::from_bits(0x41f2_b459),
        f32::from_bits(0x43a2_e571),
        f32::from_bits(0x44c0_1759),
        f32::from_bits(0x4547_fdbb),
        f32::from_bits(0x451f_90ce),
        f32::from_bits(0x43ed_43a7),
        f32::from_bits(0xc1b3_8712),
    ];
    /// `expf`'s constants: ln 2 in two parts (k ln2_hi is exact), 1 / ln 2 and the
    /// polynomial of its reduced argument.
    const E_LN2_HI: f32 = f32::from_bits(0x3f31_7200);
    const E_LN2_LO: f32 = f32::from_bits(0x35bf_be8e);
    const E_INV_LN2: f32 = f32::from_bits(0x3fb8_aa3b);
    const E_P1: f32 = f32::from_bits(0x3e2a_aa8f);
    const E_P2: f32 = f32::from_bits(0xbb35_5215);

    /// Whether the CPU has the features the vector loops are compiled for.
    pub(super) fn usable() -> bool {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }

    /// [`super::erf_of`] in 512-bit registers when `wide` (which needs AVX-512F), else in
    /// 256-bit.
    pub(super) fn erf_with<F: Fn(f32) -> f32 + Copy>(x: &[f32], arg: F, wide: bool) -> Vec<f32> {
        assert!(
            usable() && (!wide || std::arch::is_x86_feature_detected!("avx512f")),
            "erf_with: the CPU lacks the features of the variant asked for"
        );
        // Most of a network's inputs are near 0, where `erff` takes its cheapest range: every
        // element first takes that range's loop; the others are gathered and take the loop
        // that evaluates every range.
        let mut out = vec![0.0f32; x.len()];
        // SAFETY: the assertion above checked that the CPU has AVX2 and FMA, and AVX-512F where
        // `wide`: the features each function is compiled for. Each reads and writes only
        // through its two slices.
        #[allow(unsafe_code)]
        let any_large = if wide {
            unsafe { small_path_avx512(x, &mut out, arg) }
        } else {
            unsafe { small_path_avx2(x, &mut out, arg) }
        };
        if !any_large {
            return out;
        }
        let (at, large): (Vec<usize>, Vec<f32>) = x
            .iter()
            .enumerate()
            .map(|(i, &v)| (i, arg(v)))
            .filter(|&(_, a)| !small_range(a))
            .unzip();
        let mut y = vec![0.0f32; large.len()];
        // SAFETY: as above.
        #[allow(unsafe_code)]
        let off_path = if wide {
            unsafe { main_path_avx512(&large, &mut y) }
        } else {
            unsafe { main_path_avx2(&large, &mut y) }
        };
        for ((&i, &a), &y) in at.iter().zip(&large).zip(&y) {
            out[i] = if off_path && off_main_path(a) {
                libm::erff(a)
            } else {
                y
            };
        }
        out
    }

    /// |x| < 0.84375: `erff`'s first range, on the bits.
    #[inline]
    fn small_range(x: f32) -> bool {
        (x.to_bits() & 0x7fff_ffff) < 0x3f58_0000
    }

    /// |x| >= 6, infinities and NaN: `erff`'s own test, on the bits.
    #[inline]
    fn off_main_path(x: f32) -> bool {
        (x.to_bits() & 0x7fff_ffff) >= 0x40c0_0000
    }

    /// [`small_path`] in 256-bit registers.
    #[target_feature(enable = "avx2,fma")]
    fn small_path_avx2<F: Fn(f32) -> f32 + Copy>(x: &[f32], out: &mut [f32], arg: F) -> bool {
        small_path(x, out, arg)
    }

    /// [`small_path`] in 512-bit registers.
    #[target_feature(enable = "avx512f,avx2,fma")]
    fn small_path_avx512<F: Fn(f32) -> f32 + Copy>(x: &[f32], out: &mut [f32], arg: F) -> bool {
        small_path(x, out, arg)
    }

    /// `erff`'s first range (|x| < 0.84375) for every element. Returns whether any input is
    /// outside it (its result is then still to be computed).
    #[inline(always)]
    fn small_path<F: Fn(f32) -> f32 + Copy>(x: &[f32], out: &mut [f32], arg: F) -> bool {
        let mut large = false;
        for (o, &v) in out.iter_mut().zip(x) {
            let a = arg(v);
            large |= !small_range(a);
            *o = erf_small(a);
        }
        large
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

    /// `erff` on its main path for every element. Returns whether any input is off that path
    /// (its result then needs the library call). Inlined into the two functions above, which
    /// compile it for their registers.
    #[inline(always)]
    fn main_path(x: &[f32], out: &mut [f32]) -> bool {
        let mut off = false;
        for (o, &v) in out.iter_mut().zip(x) {
            off |= off_main_path(v);
            *o = erf(v);
        }
        off
    }

    /// `libm::expf` for -104 < a < 88 (no overflow; the results here are normal), every
    /// branch evaluated and the one `expf` takes selected: reduction a = k ln 2 + x with k = +-1
    /// for 0.5 ln 2 < |a| <= 1.5 ln 2, k = round(a / ln 2) (truncation of a / ln 2 +- 0.5)
    /// above, none below; exp(x) by the rational form; the scaling by 2^k a product by a power
    /// of two, as `scalbnf` does it for normal results.
    #[inline(always)]
    fn expf(a: f32) -> f32 {
        let bits = a.to_bits();
        let hx = bits & 0x7fff_ffff;
        let neg = bits >> 31 != 0;
        // max and min, not clamp: clamp keeps a NaN, which the conversion below must not see.
        #[allow(clippy::manual_clamp)]
        let kf = (E_INV_LN2 * a + if neg { -0.5 } else { 0.5 })
            .max(-256.0)
            .min(256.0);
        // SAFETY: kf is finite and within i32's range (clamped above; NaN becomes -256).
        #[allow(unsafe_code)]
        let k_round: i32 = unsafe { kf.to_int_unchecked() };
        let k = if hx > 0x3f85_1592 {
            k_round
        } else if neg {
            -1
        } else {
            1
        };
        let kf = k as f32;
        let hi = a - kf * E_LN2_HI;
        let lo = kf * E_LN2_LO;
        let reduce = hx > 0x3eb1_7218;
        let x = if reduce { hi - lo } else { a };
        let hi = if reduce { hi } else { a };
        let lo = if reduce { lo } else { 0.0 };
        let k = if reduce { k } else { 0 };
        let xx = x * x;
        let c = x - xx * (E_P1 + xx * E_P2);
        let y = 1.0 + (x * c / (2.0 - c) - lo + hi);
        let scaled = y * f32::from_bits(((0x7f + k) << 23) as u32);
        let y = if k == 0 { y } else { scaled };
        if hx > 0x3900_0000 { y } else { 1.0 + a }
    }

    /// `libm::erff` for |v| < 0.84375: x + x PP(x^2) / QQ(x^2), or x + x EFX8 / 8 below
    /// 2^-28.
    #[inline(always)]
    fn erf_small(v: f32) -> f32 {
        let z = v * v;
        let r = PP[0] + z * (PP[1] + z * (PP[2] + z * (PP[3] + z * PP[4])));
        let s = 1.0 + z * (QQ[0] + z * (QQ[1] + z * (QQ[2] + z * (QQ[3] + z * QQ[4]))));
        if (v.to_bits() & 0x7fff_ffff) < 0x3180_0000 {
            0.125 * (8.0 * v + EFX8 * v)
        } else {
            v + v * (r / s)
        }
    }

    /// `libm::erff` for |v| < 6, every range evaluated and the one `erff` takes selected.
    #[inline(always)]
    fn erf(v: f32) -> f32 {
        let bits = v.to_bits();
        let ix = bits & 0x7fff_ffff;
        let x = f32::from_bits(ix);
        let small = erf_small(v);
        // 0.84375 <= |x| < 1.25: erfc1
        let s1 = x - 1.0;
        let p = PA[0]
            + s1 * (PA[1] + s1 * (PA[2] + s1 * (PA[3] + s1 * (PA[4] + s1 * (PA[5] + s1 * PA[6])))));
        let q = 1.0
            + s1 * (QA[0] + s1 * (QA[1] + s1 * (QA[2] + s1 * (QA[3] + s1 * (QA[4] + s1 * QA[5])))));
        let erfc1 = 1.0 - ERX - p / q;
        // 1.25 <= |x| < 6
        let s2 = 1.0 / (x * x);
        let ra = RA[0]
            + s2 * (RA[1]
                + s2 * (RA[2]
                    + s2 * (RA[3] + s2 * (RA[4] + s2 * (RA[5] + s2 * (RA[6] + s2 * RA[7]))))));
        let sa = 1.0
            + s2 * (SA[0]
                + s2 * (SA[1]
                    + s2 * (SA[2]
                        + s2 * (SA[3] + s2 * (SA[4] + s2 * (SA[5] + s2 * (SA[6] + s2 * SA[7])))))));
        let rb = RB[0]
            + s2 * (RB[1] + s2 * (RB[2] + s2 * (RB[3] + s2 * (RB[4] + s2 * (RB[5] + s2 * RB[6])))));
        let sb = 1.0
            + s2 * (SB[0]
                + s2 * (SB[1]
                    + s2 * (SB[2] + s2 * (SB[3] + s2 * (SB[4] + s2 * (SB[5] + s2 * SB[6]))))));
        let near = ix < 0x4036_db6d;
        let r2 = if near { ra } else { rb };
        let big_s = if near { sa } else { sb };
        let zz = f32::from_bits(ix & 0xffff_e000);
        let erfc2 = expf(-zz * zz - 0.5625) * expf((zz - x) * (zz + x) + r2 / big_s) / x;
        let erfc = if ix < 0x3fa0_0000 { erfc1 } else { erfc2 };
        let y = 1.0 - erfc;
        let y = f32::from_bits(y.to_bits() | (bits & 0x8000_0000));
        if ix < 0x3f58_0000 { small } else { y }
    }
}

#[cfg(test)]
mod tests {
    use super::erf_of;

    /// [`erf_of`], and on x86-64 each register width the CPU has, against `libm::erff`.
    fn check(bits: impl Iterator<Item = u32>) {
        let x: Vec<f32> = bits.map(f32::from_bits).collect();
        #[allow(unused_mut)]
        let mut results = vec![erf_of(&x, |v| v)];
        #[cfg(target_arch = "x86_64")]
        if super::vector::usable() {
            results.push(super::vector::erf_with(&x, |v| v, false));
            if std::arch::is_x86_feature_detected!("avx512f") {
                results.push(super::vector::erf_with(&x, |v| v, true));
            }
        }
        for ours in results {
            for (&v, &e) in x.iter().zip(&ours) {
                let want = libm::erff(v);
                assert!(
                    e.to_bits() == want.to_bits() || (e.is_nan() && want.is_nan()),
                    "erf({v:e}) = {e:e}, libm gives {want:e}"
                );
            }
        }
    }

    /// Every 1,024th bit pattern, offset so that both signs, zeros, subnormals, infinities
    /// and NaN are among them, plus dense runs around each range's threshold (2^-28, 0.84375,
    /// 1.25, 1 / 0.35, 6) and around `expf`'s (0.5 ln 2 and 1.5 ln 2 of its second argument
    /// come from every range above 1.25, so they are covered by the runs).
    #[test]
    fn erf_matches_libm() {
        check((0..1u32 << 22).map(|i| (i << 10) | (i % 1021)));
        for threshold in [
            0x3180_0000u32,
            0x3f58_0000,
            0x3fa0_0000,
            0x4036_db6d,
            0x40c0_0000,
        ] {
            check((0..1u32 << 16).map(|i| threshold - (1 << 15) + i));
            check((0..1u32 << 16).map(|i| (threshold | 0x8000_0000) - (1 << 15) + i));
        }
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
        // An argument map is applied before erf, as in GELU.
        let x = [-1.0f32, 0.5, 30.0];
        let got = erf_of(&x, |v| v / std::f32::consts::SQRT_2);
        for (g, v) in got.iter().zip(x) {
            assert_eq!(
                g.to_bits(),
                libm::erff(v / std::f32::consts::SQRT_2).to_bits()
            );
        }
    }

    #[test]
    #[ignore = "every f32, each register width: about two minutes in release"]
    fn erf_matches_libm_on_every_input() {
        for hi in 0..256u32 {
            check((0..1u32 << 24).map(|lo| (hi << 24) | lo));
        }
    }
}
