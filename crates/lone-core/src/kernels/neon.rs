//! aarch64 NEON kernels. Only F32 weights for now; every other format falls back to the
//! scalar kernels through the same table.

use core::arch::aarch64::*;

use super::{MatArgs, MatFn};
use crate::tensor::DType;

pub(super) fn kernel(dtype: DType) -> Option<MatFn> {
    match dtype {
        DType::F32 => Some(f32_rows as MatFn),
        _ => None,
    }
}

/// F32 weights × f32 activations.
///
/// # Safety
/// The `MatFn` contract (see `kernels::MatFn`); NEON is part of the aarch64 baseline.
unsafe fn f32_rows(a: &MatArgs) {
    let k = a.k;
    for r in 0..a.rows {
        let w = a.w.add(r * a.w_stride) as *const f32;
        for t in 0..a.nx {
            let x = a.x.add(t * a.x_stride) as *const f32;
            let mut acc = [vdupq_n_f32(0.0); 4];
            let mut i = 0;
            while i + 16 <= k {
                for (u, ac) in acc.iter_mut().enumerate() {
                    let o = i + 4 * u;
                    *ac = vfmaq_f32(*ac, vld1q_f32(w.add(o)), vld1q_f32(x.add(o)));
                }
                i += 16;
            }
            let s = vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3]));
            let mut s = vaddvq_f32(s);
            while i < k {
                s += w.add(i).read_unaligned() * *x.add(i);
                i += 1;
            }
            *a.out.add(t * a.out_stride + r) = s;
        }
    }
}
