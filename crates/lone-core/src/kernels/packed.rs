//! Weight layouts built once per tensor for a kernel ([`Tensor::packed`]), as llama.cpp
//! repacks Q4_0 into interleaved row groups at load.
//!
//! **F16 and BF16** (x86's exact matrix-vector kernels, `x86::float_rows8`): rows in groups
//! of 8, element by element: the 8 rows' element `i` side by side (16 bytes), so one load
//! is element `i` of 8 rows and each output is one FMA chain over `i` in order, the f32
//! GEMM's own.
//!
//! **Rows by 8** (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, IQ4_NL: the 8-bit matrix-vector kernels
//! of x86's VNNI levels, `q4_0_x8` …, and aarch64's dotprod level, `neon::rows8`; Q6_K: the
//! latter's only, as are Q2_K and Q3_K): the rows are taken in groups of 8, and each group's blocks are stored block
//! by block: the 8 rows' f16 scales (16 bytes), for Q4_1/Q5_1 their 8 f16 mins (Q4_K: its
//! dmins; 16 bytes), for Q5_0/Q5_1 their 8 high-bit words (32 bytes, bits rearranged: see
//! [`high_bits_by_chunk`]), for Q4_K the three 32-bit words of its packed 6-bit scales and
//! mins (3 × 32 bytes: word `w` of row 0, …, of row 7), then the 8 rows' quant bytes (16,
//! Q8_0's 32, Q4_K's 128) in chunks of 32 bytes, chunk `c` holding bytes `4c..4c+4` of row 0,
//! then of row 1, …, of row 7. The other K-quants likewise, field by field: Q6_K the 8 rows'
//! d, their 16 scales as 4 words each (word `w` of the 8 rows, then word `w + 1`), then the
//! chunks of `ql` (32) and of `qh` (16); Q2_K d, dmin, its 16 scale bytes (4 words), `qs` (16
//! chunks); Q3_K d, its 12 scale bytes (3 words), `hmask` (8 chunks), `qs` (16). A group takes exactly the bytes its 8 rows took, so row `r` of
//! a group still starts its group at `r / 8 · 8 · row_bytes`; rows past the last whole group
//! stay as they were stored.

use super::MatArgs;
use crate::tensor::{DType, Tensor};

/// Rows per packed group.
pub(crate) const GROUP: usize = 8;

/// A run of `n` fields of a row's block as the packed layout moves them: field `j` is `size`
/// bytes (2: an f16; 4: a word of quants or scales) at `at + j·size`, stored for the 8 rows of
/// a group one after the other (16 or 32 bytes); `qh`: a Q5 high-bit word, rearranged by
/// [`high_bits_by_chunk`].
#[derive(Clone, Copy)]
struct Unit {
    at: usize,
    size: usize,
    n: usize,
    qh: bool,
}

const fn f16s(at: usize, n: usize) -> Unit {
    Unit {
        at,
        size: 2,
        n,
        qh: false,
    }
}

const fn words(at: usize, n: usize) -> Unit {
    Unit {
        at,
        size: 4,
        n,
        qh: false,
    }
}

const QH: Unit = Unit {
    qh: true,
    ..words(0, 1)
};

/// The fields of `dtype`'s block in packed order (they cover the block), if it is packed:
/// legacy formats' f16 fields (d; m), the Q5 high-bit word, then the quant words; Q4_K's d,
/// dmin, the 12 bytes of 6-bit scales and mins, then the 128 quant bytes. (Static: the GEMMs
/// unpack through this for every tile.)
fn units(dtype: DType) -> Option<&'static [Unit]> {
    const Q4_0: &[Unit] = &[f16s(0, 1), words(2, 4)];
    const Q8_0: &[Unit] = &[f16s(0, 1), words(2, 8)];
    const Q4_1: &[Unit] = &[f16s(0, 2), words(4, 4)];
    const Q5_0: &[Unit] = &[f16s(0, 1), Unit { at: 2, ..QH }, words(6, 4)];
    const Q5_1: &[Unit] = &[f16s(0, 2), Unit { at: 4, ..QH }, words(8, 4)];
    const Q4_K: &[Unit] = &[f16s(0, 2), words(4, 35)];
    // aarch64's dotprod kernels only. Q2_K: d, dmin, the 16 scale bytes (4 words), qs (16).
    const Q2_K: &[Unit] = &[f16s(80, 2), words(0, 4), words(16, 16)];
    // Q3_K: d, the 12 scale bytes (3 words), hmask (8), qs (16).
    const Q3_K: &[Unit] = &[f16s(108, 1), words(96, 3), words(0, 8), words(32, 16)];
    // Q6_K: d, the 16 scales (4 words), ql (32), qh (16).
    const Q6_K: &[Unit] = &[f16s(208, 1), words(192, 4), words(0, 32), words(128, 16)];
    // F16, BF16 (x86's exact kernels): a block is one element, so each element index holds
    // the 8 rows' values side by side (16 bytes).
    const HALF: &[Unit] = &[f16s(0, 1)];
    Some(match dtype {
        // IQ4_NL's block is Q4_0's (f16 d, 16 bytes of index pairs).
        DType::Q4_0 | DType::IQ4NL => Q4_0,
        DType::Q8_0 => Q8_0,
        DType::Q4_1 => Q4_1,
        DType::Q5_0 => Q5_0,
        DType::Q5_1 => Q5_1,
        DType::Q4K => Q4_K,
        DType::Q2K => Q2_K,
        DType::Q3K => Q3_K,
        DType::Q6K => Q6_K,
        DType::F16 | DType::BF16 => HALF,
        _ => return None,
    })
}

/// Whether [`rows_by_8`] packs `dtype`.
pub(crate) fn packs(dtype: DType) -> bool {
    units(dtype).is_some()
}

/// A Q5 block's high-bit word `qh` (bit `i` = bit 4 of element `i`) rearranged for the
/// chunked quants: byte `j`, bit `c` = bit 4 of element `4c + j` (the low nibble of quant
/// byte `4c + j`), bit `4 + c` = bit 4 of element `16 + 4c + j` (its high nibble). Chunk
/// `c`'s fifth bits are then `(h << (4 - c)) & 0x10…` and `(h >> c) & 0x10…`, byte for byte.
pub(crate) fn high_bits_by_chunk(qh: u32) -> u32 {
    let mut h = 0u32;
    for j in 0..4 {
        for c in 0..4 {
            h |= ((qh >> (4 * c + j)) & 1) << (8 * j + c);
            h |= ((qh >> (16 + 4 * c + j)) & 1) << (8 * j + 4 + c);
        }
    }
    h
}

/// The inverse of [`high_bits_by_chunk`].
fn high_bits_from_chunk(h: u32) -> u32 {
    let mut qh = 0u32;
    for j in 0..4 {
        for c in 0..4 {
            qh |= ((h >> (8 * j + c)) & 1) << (4 * c + j);
            qh |= ((h >> (8 * j + 4 + c)) & 1) << (16 + 4 * c + j);
        }
    }
    qh
}

/// `t`'s bytes in the rows-by-8 layout (module docs).
///
/// Panics if `t` is not a format [`packs`] takes, with whole blocks per row.
pub(crate) fn rows_by_8(t: &Tensor) -> Vec<u8> {
    let mut out = vec![0u8; t.data().len()];
    rows_by_8_into(t.dtype, t.row_len(), t.data(), &mut out);
    out
}

/// [`rows_by_8`] of the stored rows `data` (`dtype`, `k` elements each) into `out` (as long).
///
/// Panics if `dtype` is not a format [`packs`] takes, or `data` is not whole rows of whole
/// blocks, or `out` is not as long.
pub(crate) fn rows_by_8_into(dtype: DType, k: usize, data: &[u8], out: &mut [u8]) {
    let units = units(dtype).expect("rows_by_8: a format `packs` takes");
    let bb = dtype.block_bytes();
    let nb = k / dtype.block_size();
    let rb = nb * bb;
    assert!(
        nb * dtype.block_size() == k && rb > 0 && data.len().is_multiple_of(rb),
        "rows_by_8: whole blocks"
    );
    assert_eq!(out.len(), data.len(), "rows_by_8: output length");
    let whole = data.len() / rb / GROUP * GROUP * rb;
    out[whole..].copy_from_slice(&data[whole..]);
    let pack_group = |(src, dst): (&[u8], &mut [u8])| {
        if bb == 2 && dtype.block_size() == 1 {
            // 2-byte elements: a transpose of 8 rows of u16, 8 elements of each at a time
            // through fixed-size arrays (the loop below moves the same bytes field by field,
            // several times slower on a model's float matrices: a first prompt packs them all).
            let whole8 = nb / 8 * 8;
            for (i0, o) in (0..whole8).step_by(8).zip(dst.chunks_exact_mut(16 * GROUP)) {
                let rows: [[u8; 16]; GROUP] = core::array::from_fn(|r| {
                    src[r * rb + 2 * i0..r * rb + 2 * i0 + 16]
                        .try_into()
                        .expect("16 bytes")
                });
                let o: &mut [u8; 16 * GROUP] = o.try_into().expect("a group's 8 elements");
                for c in 0..8 {
                    for (r, row) in rows.iter().enumerate() {
                        o[16 * c + 2 * r] = row[2 * c];
                        o[16 * c + 2 * r + 1] = row[2 * c + 1];
                    }
                }
            }
            for i in whole8..nb {
                for r in 0..GROUP {
                    dst[16 * i + 2 * r..16 * i + 2 * r + 2]
                        .copy_from_slice(&src[r * rb + 2 * i..r * rb + 2 * i + 2]);
                }
            }
            return;
        }
        for b in 0..nb {
            let o = &mut dst[b * GROUP * bb..(b + 1) * GROUP * bb];
            let mut pos = 0;
            for u in units {
                for at in (u.at..).step_by(u.size).take(u.n) {
                    for r in 0..GROUP {
                        let (f, to) = (r * rb + b * bb + at, pos + u.size * r);
                        // Fixed-length moves (a copy of `u.size` bytes would call memcpy).
                        if u.size == 2 {
                            o[to..to + 2].copy_from_slice(&src[f..f + 2]);
                        } else if u.qh {
                            let w = u32::from_le_bytes(src[f..f + 4].try_into().unwrap());
                            o[to..to + 4].copy_from_slice(&high_bits_by_chunk(w).to_le_bytes());
                        } else {
                            o[to..to + 4].copy_from_slice(&src[f..f + 4]);
                        }
                    }
                    pos += GROUP * u.size;
                }
            }
        }
    };
    // Groups in parallel: a model's first prompt packs all its matrices.
    let groups = whole / (GROUP * rb).max(1);
    let dst = super::SendPtr(out.as_mut_ptr());
    super::parallel_for(groups, 16, &|range| {
        let dst = &dst;
        for g in range {
            // SAFETY: group g's GROUP·rb bytes lie inside `out` (g < groups) and only this
            // task writes them.
            let o =
                unsafe { std::slice::from_raw_parts_mut(dst.0.add(g * GROUP * rb), GROUP * rb) };
            pack_group((&data[g * GROUP * rb..(g + 1) * GROUP * rb], o));
        }
    });
}

/// Rows `r0..r0 + rows` of `t` in its stored layout, from the rows-by-8 copy `packed`
/// (`r0` a multiple of [`GROUP`]), into `dst` (`rows` stored rows): what the kernels that read
/// the stored layout (the GEMMs) take once the copy exists, so that the file's pages of the
/// original are not read again.
///
/// Panics if `r0` is not a multiple of 8 or the rows are out of range.
pub(crate) fn stored_rows(t: &Tensor, packed: &[u8], r0: usize, rows: usize, dst: &mut [u8]) {
    let rb = t.row_bytes();
    assert!(r0.is_multiple_of(GROUP) && r0 + rows <= t.n_rows() && dst.len() >= rows * rb);
    let whole = t.n_rows() / GROUP * GROUP;
    let mut r = r0;
    while r < r0 + rows {
        let d = &mut dst[(r - r0) * rb..];
        if r + GROUP <= whole && r + GROUP <= r0 + rows {
            unpack_group(
                t.dtype,
                &packed[r * rb..(r + GROUP) * rb],
                rb,
                &mut d[..GROUP * rb],
            );
            r += GROUP;
        } else {
            // Rows past the last whole group keep the stored layout; a tile that ends inside
            // a group takes that group's rows one by one.
            if r < whole {
                let g = r / GROUP * GROUP;
                let mut tmp = vec![0u8; GROUP * rb];
                unpack_group(t.dtype, &packed[g * rb..(g + GROUP) * rb], rb, &mut tmp);
                d[..rb].copy_from_slice(&tmp[(r - g) * rb..(r - g + 1) * rb]);
            } else {
                d[..rb].copy_from_slice(&packed[r * rb..(r + 1) * rb]);
            }
            r += 1;
        }
    }
}

/// One group of 8 rows (`rb` bytes each) from the rows-by-8 layout back to the stored one.
/// (A GEMM over a packed tensor runs this for every tile: fields move as `u16`/`u32`s
/// without per-field slice checks; the sizes are checked once here.)
fn unpack_group(dtype: DType, src: &[u8], rb: usize, dst: &mut [u8]) {
    let units = units(dtype).expect("a packed format");
    let bb = dtype.block_bytes();
    let nb = rb / bb;
    assert!(src.len() >= GROUP * nb * bb && dst.len() >= GROUP * rb && rb == nb * bb);
    if bb == 2 && dtype.block_size() == 1 {
        // 2-byte elements: the transpose back (as `rows_by_8_into`).
        for (i, o) in src[..GROUP * rb].chunks_exact(2 * GROUP).enumerate() {
            for r in 0..GROUP {
                dst[r * rb + 2 * i..r * rb + 2 * i + 2].copy_from_slice(&o[2 * r..2 * r + 2]);
            }
        }
        return;
    }
    for b in 0..nb {
        let (o, blk) = (src[b * GROUP * bb..].as_ptr(), dst[b * bb..].as_mut_ptr());
        let mut pos = 0;
        for u in units {
            for at in (u.at..).step_by(u.size).take(u.n) {
                for r in 0..GROUP {
                    // SAFETY: the units tile a block (`units`): a field of row r lies at
                    // `at..at + u.size` < bb of the row's block (r·rb + b·bb inside `dst`,
                    // asserted above), and its packed copy at `pos + u.size·r` inside the
                    // group's GROUP·bb bytes of block b of `src`. Unaligned reads and writes.
                    unsafe {
                        let from = o.add(pos + u.size * r);
                        let to = blk.add(r * rb + at);
                        if u.size == 2 {
                            (to as *mut u16).write_unaligned((from as *const u16).read_unaligned());
                        } else {
                            let v = (from as *const u32).read_unaligned();
                            let v = if u.qh { high_bits_from_chunk(v) } else { v };
                            (to as *mut u32).write_unaligned(v);
                        }
                    }
                }
                pos += GROUP * u.size;
            }
        }
    }
}

/// The rows of `a` past its last whole group of 8 (stored as they were: the packed kernels
/// hand them to a row-by-row kernel), if any.
///
/// # Safety
/// `a` is a kernel call's arguments (the [`super::MatFn`] contract).
#[inline(always)]
pub(crate) unsafe fn rows_past_groups(a: &MatArgs) -> Option<MatArgs> {
    let r = a.rows / 8 * 8;
    if r == a.rows {
        return None;
    }
    Some(MatArgs {
        // SAFETY: rows r.. of the call's weights (r < rows) lie inside them.
        w: unsafe { a.w.add(r * a.w_stride) },
        rows: a.rows - r,
        // SAFETY: as above, outputs r.. of the call's first activation row.
        out: unsafe { a.out.add(r) },
        ..*a
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PACKED: [DType; 12] = [
        DType::F16,
        DType::BF16,
        DType::IQ4NL,
        DType::Q2K,
        DType::Q3K,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q4K,
        DType::Q6K,
    ];

    /// Packing is a permutation of whole fields: unpacking gives the stored bytes back, and
    /// a group's first block starts with its 8 rows' scales in row order.
    #[test]
    fn rows_by_8_is_a_lossless_permutation() {
        for dtype in PACKED {
            for rows in [1usize, 8, 13, 24] {
                // F16/BF16: a width that is not a multiple of 8 elements.
                let k = match dtype.block_size() {
                    256 => 512,
                    1 => 99,
                    _ => 96,
                };
                let bytes: Vec<u8> = (0..rows * dtype.bytes_for(k).unwrap())
                    .map(|i| (i * 131 % 251) as u8)
                    .collect();
                let t = Tensor::from_bytes(dtype, vec![rows, k], bytes.clone());
                let p = rows_by_8(&t);
                assert_eq!(p.len(), bytes.len());
                let rb = dtype.bytes_for(k).unwrap();
                // Every tile start (multiples of 8) and length, as the GEMMs ask.
                for r0 in (0..rows).step_by(8) {
                    for n in 1..=rows - r0 {
                        let mut got = vec![0u8; n * rb];
                        stored_rows(&t, &p, r0, n, &mut got);
                        assert_eq!(
                            got,
                            bytes[r0 * rb..(r0 + n) * rb],
                            "{dtype} {rows} {r0} {n}"
                        );
                    }
                }
                if rows >= 8 {
                    let rb = dtype.bytes_for(k).unwrap();
                    // Where each format's d sits in its block.
                    let d = match dtype {
                        DType::Q2K => 80,
                        DType::Q3K => 108,
                        DType::Q6K => 208,
                        _ => 0,
                    };
                    for r in 0..8 {
                        assert_eq!(p[2 * r..2 * r + 2], bytes[r * rb + d..r * rb + d + 2]);
                    }
                    assert_ne!(p, bytes);
                }
            }
        }
    }

    /// Each packed format's fields cover every byte of its block exactly once (what
    /// `unpack_group`'s unchecked moves rely on).
    #[test]
    fn units_tile_their_blocks() {
        for dtype in PACKED {
            let mut seen = vec![0u8; dtype.block_bytes()];
            for u in units(dtype).unwrap() {
                seen[u.at..u.at + u.size * u.n]
                    .iter_mut()
                    .for_each(|c| *c += 1);
            }
            assert!(seen.iter().all(|&c| c == 1), "{dtype}");
        }
        assert!(!packs(DType::Q5K) && !packs(DType::F32));
    }

    /// The rearranged high bits say, byte by byte, what the module docs say: for every
    /// element, its fifth bit lands where chunk `c`'s shift and mask pick it up.
    #[test]
    fn high_bits_by_chunk_puts_each_bit_where_its_chunk_reads_it() {
        for e in 0..32u32 {
            let h = high_bits_by_chunk(1 << e);
            assert_eq!(h.count_ones(), 1);
            let (byte_pos, hi) = (e % 16, e >= 16);
            let (c, j) = (byte_pos / 4, byte_pos % 4);
            let bits = if hi { h >> c } else { h << (4 - c) } & 0x1010_1010;
            assert_eq!(bits, 0x10 << (8 * j), "element {e}");
            assert_eq!(high_bits_from_chunk(h), 1 << e);
        }
    }
}
