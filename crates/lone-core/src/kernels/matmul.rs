//! The matrix product driver: the matrix-vector path (rows split over the pool, up to 4
//! activation rows per kernel call) and the choice of a many-row GEMM.

use super::*;

/// Weight rows per kernel call: a tile small enough to stay in L1 while every group of 4
/// activation rows passes over it.
pub(super) const TILE_ROWS: usize = 16;

/// Weight rows per call of a kernel that keeps the f32 GEMM's chain ([`Kernel::gemm_chain`]):
/// one FMA chain per output over all of `k`, so independent chains come only from more rows
/// (8 groups of 8 for one activation row); its tile is read from L2.
pub(super) const CHAIN_TILE_ROWS: usize = 64;

#[derive(Clone, Copy)]
pub(super) struct SendPtr<T>(pub(super) *mut T);
// SAFETY: used only to hand disjoint output rows / read-only buffers to pool threads, all of
// which finish before the owning borrow ends.
unsafe impl<T> Send for SendPtr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for SendPtr<T> {}

thread_local! {
    pub(super) static QBUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    pub(super) static DBUF: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    pub(super) static SBUF: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// Activation rows in the pair layout ([`interleave_pairs`]).
    static PBUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// One tile's weight rows in the stored layout, rebuilt from a packed copy (`rows_task`).
    static TBUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// One tile's weight rows decoded ([`Kernel::predecode`], `rows_task`).
    static DECBUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// `out[t, r] = sum_k w[r, k] * x[t, k]` for `n` activation rows `x` of length `K = w.row_len()`;
/// `out` has `n * w.n_rows()` elements. Each weight block is loaded once per group of up to
/// 4 activation rows. Uses the detected [`Isa`] and this thread's [`exact`] mode.
pub fn matmul(w: &Tensor, x: &[f32], n: usize, out: &mut [f32]) {
    let a = active();
    let kern = a.table[dtype_index(w.dtype)][mode() as usize];
    matmul_kernel(kern, w, x, n, out);
}

/// [`matmul`] with an explicit kernel family and mode (tests, benchmarks).
///
/// Panics if `isa` is not available on this CPU or the shapes do not match.
pub fn matmul_with(isa: Isa, exact: bool, w: &Tensor, x: &[f32], n: usize, out: &mut [f32]) {
    assert!(isa.is_available(), "{isa:?} is not supported by this CPU");
    matmul_kernel(kernel(isa, w.dtype, exact), w, x, n, out);
}

/// [`matmul`] of several matrices with the same input width over the same activations
/// (`outs[i]` gets `x · ws[i]ᵀ`), e.g. the q/k/v or gate/up projections. When they all take
/// the same many-row GEMM, the activations are packed once and all the matrices' tiles share
/// one parallel region; the results are those of separate [`matmul`] calls.
///
/// Panics if the shapes do not match.
pub fn matmul_many(ws: &[&Tensor], x: &[f32], n: usize, outs: &mut [&mut [f32]]) {
    assert_eq!(ws.len(), outs.len(), "matmul_many: one output per matrix");
    let a = active();
    let ex = mode() as usize;
    let kerns: Vec<Kernel> = ws
        .iter()
        .map(|w| a.table[dtype_index(w.dtype)][ex])
        .collect();
    let k = ws.first().map_or(0, |w| w.row_len());
    let p = kerns.first().map_or(Path::Rows, |kern| path(kern, n, k));
    // One pass serves them all when every matrix is well formed and takes the same path, and,
    // on the matrix-vector path, its kernels take the f32 activations as they are (no
    // per-format preparation).
    let shared = ws.len() > 1
        && n > 0
        && k > 0
        && ws.iter().zip(outs.iter()).all(|(w, o)| {
            w.row_len() == k
                && x.len() == n * k
                && o.len() == n * w.n_rows()
                && w.dtype.bytes_for(k).map(|rb| rb * w.n_rows()) == Some(w.data().len())
                && w.n_rows() > 0
        })
        && kerns.iter().all(|kern| {
            path(kern, n, k) == p
                && (p != Path::Rows || matches!(kern.act, Act::F32 | Act::F32Sums))
        });
    if !shared {
        for ((w, kern), o) in ws.iter().zip(kerns).zip(outs.iter_mut()) {
            matmul_kernel(kern, w, x, n, o);
        }
        return;
    }
    let jobs: Vec<Job> = ws
        .iter()
        .zip(kerns)
        .zip(outs.iter_mut())
        .map(|((w, kern), o)| Job {
            w,
            kern,
            out: SendPtr(o.as_mut_ptr()),
        })
        .collect();
    if p != Path::Rows {
        run_gemm_path(p, &jobs, x, n);
        return;
    }
    // f32 kernels read the first k of each row, whatever the stride: one F32Sums copy serves
    // every job when any of them needs the block sums.
    let mut sbuf = SBUF.with(|b| std::mem::take(&mut *b.borrow_mut()));
    let (xp, xs) = if jobs.iter().any(|j| j.kern.act == Act::F32Sums) {
        with_block_sums(x, n, k, &mut sbuf);
        (SendPtr(sbuf.as_ptr() as *mut u8), 4 * (k + k / 32))
    } else {
        (SendPtr(x.as_ptr() as *mut u8), 4 * k)
    };
    for_each_chunk(&jobs, rows_chunk, &|job, range| {
        let xp = &xp;
        // SAFETY: checked above: whole weight rows, n activation rows of xs bytes (k f32,
        // then block sums where the kernels take them), n·m outputs per job; each chunk's
        // columns belong to its task alone.
        unsafe { rows_task(job, xp.0, xs, None, n, range) }
    });
    SBUF.with(|b| *b.borrow_mut() = sbuf);
}

pub(super) fn dtype_index(d: DType) -> usize {
    DType::ALL
        .iter()
        .position(|&x| x == d)
        .expect("DType::ALL lists every format")
}

pub(super) fn matmul_kernel(kern: Kernel, w: &Tensor, x: &[f32], n: usize, out: &mut [f32]) {
    let k = w.row_len();
    let m = w.n_rows();
    let dtype = w.dtype;
    assert_eq!(x.len(), n * k, "matmul: activation length");
    assert_eq!(out.len(), n * m, "matmul: output length");
    let rb = dtype
        .bytes_for(k)
        .expect("weight rows are whole blocks (checked at load)");
    let data = w.data();
    assert_eq!(data.len(), m * rb, "matmul: weight bytes");
    if n == 0 || m == 0 {
        return;
    }
    if k == 0 {
        out.fill(0.0);
        return;
    }
    let p = path(&kern, n, k);
    if p != Path::Rows {
        let job = Job {
            w,
            kern,
            out: SendPtr(out.as_mut_ptr()),
        };
        run_gemm_path(p, std::slice::from_ref(&job), x, n);
        return;
    }
    let mut qbuf = QBUF.with(|b| std::mem::take(&mut *b.borrow_mut()));
    let mut dbuf = DBUF.with(|b| std::mem::take(&mut *b.borrow_mut()));
    let mut sbuf = SBUF.with(|b| std::mem::take(&mut *b.borrow_mut()));
    let mut pbuf = PBUF.with(|b| std::mem::take(&mut *b.borrow_mut()));
    let mut pairs = None;
    let (xp, xs): (*const u8, usize) = match kern.act {
        Act::F32 => (x.as_ptr() as *const u8, 4 * k),
        Act::F32Sums => {
            with_block_sums(x, n, k, &mut sbuf);
            (sbuf.as_ptr() as *const u8, 4 * (k + k / 32))
        }
        Act::Quant(ad) | Act::QuantDeq(ad) => {
            let qb = ad
                .bytes_for(k)
                .expect("8-bit blocks match the weight blocks");
            // Q8_1 rows for the integer kernels carry two f32 per block after the blocks:
            // d·Σq, exactly (ggml's f16 `s` field rounds it), and d ([`side_q8_1`]).
            let sums = matches!(kern.act, Act::Quant(DType::Q8_1));
            let qs = if sums { qb + Q8_1_SIDE * (k / 32) } else { qb };
            qbuf.resize(n * qs, 0);
            quantize_rows(ad, x, k, qb, qs, &mut qbuf);
            if kern.pairs.is_some() && sums && n >= 2 {
                let ps = k / 32 * PAIR_BB;
                grow(&mut pbuf, n.div_ceil(2) * ps);
                interleave_pairs(&qbuf, n, k, qs, &mut pbuf);
                pairs = Some((SendPtr(pbuf.as_mut_ptr()), ps));
            }
            if let Act::QuantDeq(_) = kern.act {
                dbuf.resize(n * k, 0.0);
                for (q, d) in qbuf.chunks(qs).zip(dbuf.chunks_mut(k)) {
                    quant::dequantize_row(ad, &q[..qb], d).expect("sizes checked above");
                }
                (dbuf.as_ptr() as *const u8, 4 * k)
            } else {
                (qbuf.as_ptr(), qs)
            }
        }
    };
    let job = Job {
        w,
        kern,
        out: SendPtr(out.as_mut_ptr()),
    };
    let xp = SendPtr(xp as *mut u8);
    for_each_chunk(std::slice::from_ref(&job), rows_chunk, &|job, range| {
        let xp = &xp;
        // SAFETY: the weights hold m·rb bytes (checked above), the activations n rows of xs
        // bytes in the kernel's format, and where `pairs` is set the same rows in the pair
        // layout (built above), out n·m f32; `range` is this task's.
        unsafe {
            rows_task(
                job,
                xp.0,
                xs,
                pairs.map(|(p, ps)| (p.0 as *const u8, ps)),
                n,
                range,
            )
        }
    });
    PBUF.with(|b| *b.borrow_mut() = pbuf);
    QBUF.with(|b| *b.borrow_mut() = qbuf);
    DBUF.with(|b| *b.borrow_mut() = dbuf);
    SBUF.with(|b| *b.borrow_mut() = sbuf);
}

/// [`Act::F32Sums`] rows of the `n` activation rows `x` (`k` each) into `buf`.
pub(super) fn with_block_sums(x: &[f32], n: usize, k: usize, buf: &mut Vec<f32>) {
    let nb = k / 32;
    let rs = k + nb;
    grow(buf, n * rs);
    for (xr, o) in x.chunks_exact(k).zip(buf.chunks_exact_mut(rs)).take(n) {
        o[..k].copy_from_slice(xr);
        for (b, s) in o[k..].iter_mut().enumerate() {
            *s = xr[32 * b..32 * b + 32].iter().sum();
        }
    }
}

/// Rows per task of the matrix-vector path: about 4 tasks per thread, whole tiles.
pub(super) fn rows_chunk(m: usize) -> usize {
    m.div_ceil(threads() * 4).next_multiple_of(TILE_ROWS)
}

/// The matrix-vector kernels over weight rows `range` of `job`: `TILE_ROWS` rows by up to 4
/// activation rows per call; with `pairs` (the same rows in the pair layout, pairs `ps`
/// bytes apart), [`Kernel::pairs`] takes the tiles' whole groups of 8 rows, [`PAIR_ROWS`]
/// activation rows per call.
///
/// # Safety
/// `job.w` holds whole rows of its format; `xp` holds `n` activation rows of `xs` bytes in
/// the format `job.kern` takes, and `pairs` the same rows in the pair layout; `job.out`
/// holds `n × m` f32 and no other task writes the columns `range`.
pub(super) unsafe fn rows_task(
    job: &Job,
    xp: *const u8,
    xs: usize,
    pairs: Option<(*const u8, usize)>,
    n: usize,
    range: std::ops::Range<usize>,
) {
    let k = job.w.row_len();
    let m = job.w.n_rows();
    let rb = job.w.dtype.bytes_for(k).expect("checked by the caller");
    let wp = if job.kern.packed {
        // Groups of 8 rows at the rows' own offsets: `range` starts at a multiple of
        // TILE_ROWS (`rows_chunk`), so every tile starts a group.
        job.w.packed(packed::rows_by_8).as_ptr()
    } else {
        job.w.data().as_ptr()
    };
    // A kernel that reads the stored layout (an exact one: a prompt's logit row) over weights
    // whose packed copy exists takes each tile's rows rebuilt from that copy, so the file's
    // pages, handed back when the copy was built, stay out of memory.
    let from_packed = if job.kern.packed || !packed::packs(job.w.dtype) {
        None
    } else {
        job.w.packed_if_built()
    };
    let mut tbuf = TBUF.with(|b| std::mem::take(&mut *b.borrow_mut()));
    let mut decbuf = DECBUF.with(|b| std::mem::take(&mut *b.borrow_mut()));
    let tile = if job.kern.gemm_chain {
        CHAIN_TILE_ROWS
    } else {
        TILE_ROWS
    };
    let mut r0 = range.start;
    while r0 < range.end {
        let rows = tile.min(range.end - r0);
        let w = match from_packed {
            Some(p) => {
                grow(&mut tbuf, rows * rb);
                packed::stored_rows(job.w, p, r0, rows, &mut tbuf);
                tbuf.as_ptr()
            }
            // SAFETY: rows r0..r0+rows lie inside the weights (the function's contract).
            None => unsafe { wp.add(r0 * rb) },
        };
        // The rows of whole groups of 8 (a multiple of 8: tiles start groups) go to the
        // pairs kernel when there is one, the rest to the matrix-vector kernel.
        let wide = job.kern.pairs.zip(pairs);
        let grouped = wide.map_or(0, |_| (m / 8 * 8).clamp(r0, r0 + rows) - r0);
        if let Some((f, (pp, ps))) = wide.filter(|_| grouped > 0) {
            for t0 in (0..n).step_by(PAIR_ROWS) {
                // SAFETY: as below; pairs t0/2.. of the pair layout hold rows t0..t0+nx.
                unsafe {
                    f(&MatArgs {
                        dtype: job.w.dtype,
                        w,
                        w_stride: rb,
                        rows: grouped,
                        x: pp.add(t0 / 2 * ps),
                        x_stride: ps,
                        nx: PAIR_ROWS.min(n - t0),
                        k,
                        out: job.out.0.add(t0 * m + r0),
                        out_stride: m,
                    })
                };
            }
        }
        // SAFETY: rows r0 + grouped.. lie inside the tile.
        let (tw, tr0, trows) = (unsafe { w.add(grouped * rb) }, r0 + grouped, rows - grouped);
        // More than one call's activation rows: formats with a costly decoding take the tile
        // decoded once (the same products, bit for bit: `Kernel::predecode`).
        let (tw, tstride, f) = match job.kern.predecode {
            Some((decode, f)) if n > 4 && trows > 0 => {
                let ds = k / 32 * DECODED_BB;
                grow(&mut decbuf, trows * ds);
                // SAFETY: trows rows of rb bytes at tw (above); decbuf holds trows·ds bytes;
                // the kernel's ISA is available (the function's contract).
                unsafe { decode(tw, rb, trows, k, decbuf.as_mut_ptr()) };
                (decbuf.as_ptr(), ds, f)
            }
            _ => (tw, rb, job.kern.f),
        };
        let mut t0 = 0;
        while t0 < n && trows > 0 {
            let nx = 4.min(n - t0);
            // SAFETY: rows tr0..tr0+trows of the weights and activation rows t0..t0+nx are in
            // bounds; out[t·m + r] for these r belongs to this task alone; `kern` was built
            // for this dtype on an available ISA (the function's contract).
            unsafe {
                let a = MatArgs {
                    dtype: job.w.dtype,
                    w: tw,
                    w_stride: tstride,
                    rows: trows,
                    x: xp.add(t0 * xs),
                    x_stride: xs,
                    nx,
                    k,
                    out: job.out.0.add(t0 * m + tr0),
                    out_stride: m,
                };
                f(&a);
            }
            t0 += nx;
        }
        r0 += rows;
    }
    TBUF.with(|b| *b.borrow_mut() = tbuf);
    DECBUF.with(|b| *b.borrow_mut() = decbuf);
}

/// Grows a scratch buffer to at least `n` elements. Never shrinks, and never re-initialises
/// what is there: every user overwrites the part it reads (buffers alternate between the
/// sizes of different matrices, and zero-filling on each growth showed up as memset time).
pub(super) fn grow<T: Clone + Default>(v: &mut Vec<T>, n: usize) {
    if v.len() < n {
        v.resize(n, T::default());
    }
}

/// Bytes per Q8_1 block after an activation row's blocks, for the integer kernels
/// ([`side_q8_1`]).
pub(crate) const Q8_1_SIDE: usize = 8;

/// A Q8_1 activation block's side values for the integer kernels: d·Σq (exact in f32; ggml's
/// f16 `s` field rounds it), then d as f32 (the stored f16, converted once here instead of in
/// every weight row's pass).
pub(crate) fn side_q8_1(out: &mut [u8], d: half::f16, sq: i32) {
    let d = d.to_f32();
    out[..4].copy_from_slice(&(d * sq as f32).to_ne_bytes());
    out[4..8].copy_from_slice(&d.to_ne_bytes());
}

/// Bytes of one pair's block in the pair layout ([`interleave_pairs`]).
pub(crate) const PAIR_BB: usize = 96;

/// Activation rows per call of a [`Kernel::pairs`] kernel (`MatArgs::nx`, at most).
pub(crate) const PAIR_ROWS: usize = 16;

/// **The pair layout**, taken by aarch64's kernels for several activation rows
/// ([`Kernel::pairs`], `neon::pairs`): Q8_1 rows two at a time (`a`, `b`; a lone last row
/// is paired with zeros), each pair's blocks stored block by block, [`PAIR_BB`] bytes each:
/// the 32 codes as four 8-byte octets, octet `j` of `a` at `16j`, of `b` at `16j + 8`; then
/// `[dx_a, dx_b, dx_a, dx_b]` (f32) and `[s_a, s_b, s_a, s_b]` (`s = dx·Σq`, the side values
/// of [`side_q8_1`]). One 16-byte load is then what `smmla` multiplies (two rows by 8
/// codes) and what `sdot` by element reads (lanes 0-1 for `a`, 2-3 for `b`).
///
/// Writes the pairs of the `n` rows in `q` (`qs` bytes apart: `k / 32` blocks of 36 bytes,
/// then [`Q8_1_SIDE`] bytes per block) into `out`, one pair every `k / 32 · PAIR_BB` bytes.
///
/// Panics if `q` or `out` is short.
pub(super) fn interleave_pairs(q: &[u8], n: usize, k: usize, qs: usize, out: &mut [u8]) {
    let nb = k / 32;
    let ps = nb * PAIR_BB;
    assert!(q.len() >= n * qs && out.len() >= n.div_ceil(2) * ps && qs >= nb * (36 + 8));
    for (p, o) in out.chunks_exact_mut(ps).take(n.div_ceil(2)).enumerate() {
        let rows = [2 * p, 2 * p + 1].map(|t| (t < n).then(|| &q[t * qs..(t + 1) * qs]));
        for (b, o) in o.chunks_exact_mut(PAIR_BB).enumerate() {
            let o: &mut [u8; PAIR_BB] = o.try_into().expect("PAIR_BB bytes");
            for (i, row) in rows.iter().enumerate() {
                // The block's 32 codes and its [dx·Σq, dx] (zeros for a missing row).
                let (codes, side): ([u8; 32], [u8; 8]) = match row {
                    Some(r) => (
                        r[b * 36 + 4..b * 36 + 36].try_into().expect("32 codes"),
                        r[nb * 36 + b * Q8_1_SIDE..][..8]
                            .try_into()
                            .expect("8 bytes"),
                    ),
                    None => ([0; 32], [0; 8]),
                };
                for j in 0..4 {
                    o[16 * j + 8 * i..16 * j + 8 * i + 8].copy_from_slice(&codes[8 * j..8 * j + 8]);
                }
                for lane in [i, i + 2] {
                    o[64 + 4 * lane..68 + 4 * lane].copy_from_slice(&side[4..8]);
                    o[80 + 4 * lane..84 + 4 * lane].copy_from_slice(&side[..4]);
                }
            }
        }
    }
}

/// Quantize `n` rows of `k` values to `ad` blocks (ggml's reference quantizers) into rows of
/// `qs` bytes (`qb` of blocks, then for Q8_1 [`Q8_1_SIDE`] bytes per block), in parallel for
/// many rows.
pub(super) fn quantize_rows(ad: DType, x: &[f32], k: usize, qb: usize, qs: usize, q: &mut [u8]) {
    let simd = active().vec.quant8;
    let one = |xr: &[f32], qr: &mut [u8]| {
        let (blocks, sums) = qr.split_at_mut(qb);
        // SAFETY: the table holds the function only where its ISA is available.
        if simd.is_some_and(|f| unsafe { f(ad, xr, blocks, sums) }) {
            return;
        }
        quant::quantize_row(ad, xr, blocks).expect("sizes checked by the caller");
        if !sums.is_empty() {
            for (b, s) in blocks.chunks(36).zip(sums.chunks_mut(Q8_1_SIDE)) {
                let d = half::f16::from_le_bytes([b[0], b[1]]);
                let sq: i32 = b[4..].iter().map(|&v| i32::from(v as i8)).sum();
                side_q8_1(s, d, sq);
            }
        }
    };
    let n = x.len() / k;
    if n < 8 {
        for (xr, qr) in x.chunks(k).zip(q.chunks_mut(qs)) {
            one(xr, qr);
        }
        return;
    }
    let qp = SendPtr(q.as_mut_ptr());
    parallel_for(n, 4, &|range| {
        let qp = &qp;
        for t in range {
            // SAFETY: row t's bytes lie inside `q` and no other task touches them.
            let qr = unsafe { std::slice::from_raw_parts_mut(qp.0.add(t * qs), qs) };
            one(&x[t * k..(t + 1) * k], qr);
        }
    });
}
