//! Weight layouts built once per tensor for a kernel ([`Tensor::packed`]), as llama.cpp
//! repacks Q4_0 into interleaved row groups at load.
//!
//! **Rows by 8** (Q4_0, Q4_1; the x86 8-bit matrix-vector kernels `q4_0_x8`/`q4_1_x8`): the
//! rows are taken in groups of 8, and each group's blocks are stored block by block: the 8
//! rows' f16 scales (16 bytes), for Q4_1 their 8 f16 mins (16 bytes), then the 8 rows'
//! 16 quant bytes in 4 chunks of 32 bytes, chunk `c` holding bytes `4c..4c+4` of row 0, then
//! of row 1, …, of row 7. A group takes exactly the bytes its 8 rows took, so row `r` of a
//! group still starts its group at `r / 8 · 8 · row_bytes`; rows past the last whole group
//! stay as they were stored.

use crate::tensor::{DType, Tensor};

/// Rows per packed group.
pub(crate) const GROUP: usize = 8;

/// Bytes before the quants in each block of a format packed by 8 (the f16 scale, and min).
fn header_bytes(dtype: DType) -> Option<usize> {
    match dtype {
        DType::Q4_0 => Some(2),
        DType::Q4_1 => Some(4),
        _ => None,
    }
}

/// `t`'s bytes in the rows-by-8 layout (module docs).
///
/// Panics if `t` is not Q4_0/Q4_1 with whole blocks per row.
pub(crate) fn rows_by_8(t: &Tensor) -> Vec<u8> {
    let hb = header_bytes(t.dtype).expect("rows_by_8: Q4_0 or Q4_1");
    let bb = t.dtype.block_bytes();
    let k = t.row_len();
    let nb = k / 32;
    let rb = nb * bb;
    let data = t.data();
    assert_eq!(data.len(), t.n_rows() * rb, "rows_by_8: whole blocks");
    let mut out = data.to_vec();
    let whole = t.n_rows() / GROUP * GROUP * rb;
    let pack_group = |(src, dst): (&[u8], &mut [u8])| {
        for b in 0..nb {
            let o = &mut dst[b * GROUP * bb..(b + 1) * GROUP * bb];
            let (head, quants) = o.split_at_mut(GROUP * hb);
            for r in 0..GROUP {
                let blk = &src[r * rb + b * bb..r * rb + (b + 1) * bb];
                for f in 0..hb / 2 {
                    head[16 * f + 2 * r..16 * f + 2 * r + 2]
                        .copy_from_slice(&blk[2 * f..2 * f + 2]);
                }
                for c in 0..4 {
                    quants[32 * c + 4 * r..32 * c + 4 * r + 4]
                        .copy_from_slice(&blk[hb + 4 * c..hb + 4 * c + 4]);
                }
            }
        }
    };
    data[..whole]
        .chunks(GROUP * rb)
        .zip(out[..whole].chunks_mut(GROUP * rb))
        .for_each(pack_group);
    out
}

/// The inverse of [`rows_by_8`] (tests: the layout loses nothing).
#[cfg(test)]
pub(crate) fn unpack_rows_by_8(dtype: DType, packed: &[u8], rows: usize, k: usize) -> Vec<u8> {
    let hb = header_bytes(dtype).expect("Q4_0 or Q4_1");
    let bb = dtype.block_bytes();
    let nb = k / 32;
    let rb = nb * bb;
    let mut out = packed.to_vec();
    for g in 0..rows / GROUP {
        let src = &packed[g * GROUP * rb..(g + 1) * GROUP * rb];
        let dst = &mut out[g * GROUP * rb..(g + 1) * GROUP * rb];
        for b in 0..nb {
            let o = &src[b * GROUP * bb..(b + 1) * GROUP * bb];
            for r in 0..GROUP {
                let blk = &mut dst[r * rb + b * bb..r * rb + (b + 1) * bb];
                for f in 0..hb / 2 {
                    blk[2 * f..2 * f + 2].copy_from_slice(&o[16 * f + 2 * r..16 * f + 2 * r + 2]);
                }
                for c in 0..4 {
                    let q = GROUP * hb + 32 * c + 4 * r;
                    blk[hb + 4 * c..hb + 4 * c + 4].copy_from_slice(&o[q..q + 4]);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Packing is a permutation of whole fields: unpacking gives the stored bytes back, and
    /// a group's first block starts with its 8 rows' scales in row order.
    #[test]
    fn rows_by_8_is_a_lossless_permutation() {
        for dtype in [DType::Q4_0, DType::Q4_1] {
            for rows in [1usize, 8, 13, 24] {
                let k = 96;
                let bytes: Vec<u8> = (0..rows * dtype.bytes_for(k).unwrap())
                    .map(|i| (i * 131 % 251) as u8)
                    .collect();
                let t = Tensor::from_bytes(dtype, vec![rows, k], bytes.clone());
                let p = rows_by_8(&t);
                assert_eq!(p.len(), bytes.len());
                assert_eq!(
                    unpack_rows_by_8(dtype, &p, rows, k),
                    bytes,
                    "{dtype} {rows}"
                );
                if rows >= 8 {
                    let rb = dtype.bytes_for(k).unwrap();
                    for r in 0..8 {
                        assert_eq!(p[2 * r..2 * r + 2], bytes[r * rb..r * rb + 2]);
                    }
                    assert_ne!(p, bytes);
                }
            }
        }
    }
}
