//! The many-row paths: the exact f32 GEMM, fast mode's 8-bit and bf16 GEMMs.

use super::*;

/// Activation rows from which the exact path switches from the matrix-vector kernels (which
/// dequantize each weight block once per 4 activation rows) to dequantize-once + f32 GEMM
/// (measured crossover ≈ 13 rows on the dev machine: the GEMM pays a whole dequantization
/// pass and computes 16 rows at a time).
pub(super) const GEMM_MIN_ROWS: usize = 16;

/// The same for fast mode's 8-bit GEMM (crossover ≈ 6 rows: its unpacking pass is cheap).
#[cfg(target_arch = "x86_64")]
pub(super) const IGEMM_MIN_ROWS: usize = 6;

/// The same for fast mode's bf16 GEMM (no unpacking at all; 16 rows per pass).
#[cfg(target_arch = "x86_64")]
pub(super) const BGEMM_MIN_ROWS: usize = 8;

thread_local! {
    pub(super) static BPACK: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
}

/// Fast mode's many-row path for BF16 weights ([`bf16`]): activation rows rounded to bf16 and
/// packed once, then every weight row (used in place) multiplied by every block.
#[cfg(target_arch = "x86_64")]
pub(super) fn bgemm(jobs: &[Job], x: &[f32], n: usize) {
    let k = jobs[0].w.row_len();
    let rb = 2 * k;
    let blocks = n.div_ceil(bf16::TB);
    let bl = bf16::block_len(k);
    let mut xp = BPACK.with(|b| std::mem::take(&mut *b.borrow_mut()));
    grow(&mut xp, blocks * bl);
    let pp = SendPtr(xp.as_mut_ptr());
    parallel_for(blocks, 1, &|range| {
        let pp = &pp;
        for b in range {
            let rows = bf16::TB.min(n - b * bf16::TB);
            // SAFETY: block b's u32 lie inside xp and only this task writes them; x holds
            // rows·k f32 from row b·TB; the bgemm flag means bf16::available().
            unsafe { bf16::pack_x(x.as_ptr().add(b * bf16::TB * k), rows, k, pp.0.add(b * bl)) };
        }
    });
    let xq = SendPtr(xp.as_mut_ptr());
    for_each_tile(jobs, &|job, range| {
        let xq = &xq;
        let m = job.w.n_rows();
        let a = bf16::Bf16GemmArgs {
            // SAFETY: rows of `range` lie inside the m·rb weight bytes (checked by
            // matmul_kernel).
            w: unsafe { job.w.data().as_ptr().add(range.start * rb) },
            w_stride: rb,
            rows: range.len(),
            x: xq.0,
            n,
            k,
            // SAFETY: columns `range` of every output row (out has n·m elements).
            out: unsafe { job.out.0.add(range.start) },
            out_stride: m,
        };
        // SAFETY: the args describe valid buffers; out[t·m + r] for r in this task's range is
        // written by this task alone; rows ≥ 1, n ≥ BGEMM_MIN_ROWS; bf16::available().
        unsafe { bf16::gemm(&a) };
    });
    BPACK.with(|b| *b.borrow_mut() = xp);
}

/// Weight rows dequantized at a time by one task of the GEMM path.
pub(super) const GEMM_TILE_ROWS: usize = 48;

/// One weight matrix of a (multi-)matmul on a GEMM path, and where its `n × m` output goes.
pub(super) struct Job<'a> {
    pub(super) w: &'a Tensor,
    pub(super) kern: Kernel,
    pub(super) out: SendPtr<f32>,
}

/// Hands the `GEMM_TILE_ROWS`-row tiles of every job out over the pool in one parallel region
/// (several small matrices then share one synchronisation and balance each other).
pub(super) fn for_each_tile(jobs: &[Job], task: &(dyn Fn(&Job, std::ops::Range<usize>) + Sync)) {
    for_each_chunk(jobs, |_| GEMM_TILE_ROWS, task)
}

/// Splits every job's rows into chunks of `chunk(m)` rows and runs `task(job, rows)` on each,
/// all jobs in one parallel region.
pub(super) fn for_each_chunk(
    jobs: &[Job],
    chunk: impl Fn(usize) -> usize,
    task: &(dyn Fn(&Job, std::ops::Range<usize>) + Sync),
) {
    let mut starts = Vec::with_capacity(jobs.len());
    let mut sizes = Vec::with_capacity(jobs.len());
    let mut total = 0;
    for j in jobs {
        let m = j.w.n_rows();
        let c = chunk(m).max(1);
        starts.push(total);
        sizes.push(c);
        total += m.div_ceil(c);
    }
    parallel_for(total, 1, &|chunks| {
        for t in chunks {
            let j = starts.partition_point(|&s| s <= t) - 1;
            let m = jobs[j].w.n_rows();
            let r0 = (t - starts[j]) * sizes[j];
            task(&jobs[j], r0..(r0 + sizes[j]).min(m));
        }
    });
}

/// Which way [`matmul`] multiplies: a many-row GEMM (one activation packing for all the
/// matrices that share it) or the matrix-vector kernels.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Path {
    /// Fast mode, BF16 weights.
    #[cfg(target_arch = "x86_64")]
    Bgemm,
    /// The f32 GEMM with activation blocks of this many rows.
    Gemm(usize),
    /// Fast mode's 8-bit GEMM.
    #[cfg(target_arch = "x86_64")]
    Igemm,
    /// The super-block i-quants' 8-bit GEMM (fast and auto modes).
    #[cfg(target_arch = "x86_64")]
    SbGemm,
    Rows,
}

pub(super) fn path(kern: &Kernel, n: usize, k: usize) -> Path {
    #[cfg(target_arch = "x86_64")]
    if kern.bgemm && n >= BGEMM_MIN_ROWS {
        return Path::Bgemm;
    }
    // Exact prompt rows take the GEMM in any number, decode rows the matrix-vector kernels,
    // so that a row's result does not depend on the others. Kernels that give the GEMM's own
    // chain ([`Kernel::gemm_chain`]) serve both by row count alone.
    let gemm_here = if kern.gemm_chain {
        n >= GEMM_MIN_ROWS
    } else {
        prompt_rows() || (n >= GEMM_MIN_ROWS && !decode_rows())
    };
    if let Some(g) = kern.gemm.filter(|_| gemm_here) {
        return Path::Gemm(g.tb);
    }
    #[cfg(target_arch = "x86_64")]
    if kern.igemm && n >= IGEMM_MIN_ROWS && k.is_multiple_of(32) {
        return Path::Igemm;
    }
    #[cfg(target_arch = "x86_64")]
    if kern.sbgemm && n >= IGEMM_MIN_ROWS && k.is_multiple_of(256) {
        return Path::SbGemm;
    }
    let _ = k;
    Path::Rows
}

/// Runs jobs that all take `p` (not [`Path::Rows`]).
pub(super) fn run_gemm_path(p: Path, jobs: &[Job], x: &[f32], n: usize) {
    match p {
        #[cfg(target_arch = "x86_64")]
        Path::Bgemm => bgemm(jobs, x, n),
        Path::Gemm(_) => gemm(jobs, x, n),
        #[cfg(target_arch = "x86_64")]
        Path::Igemm => igemm(jobs, x, n),
        #[cfg(target_arch = "x86_64")]
        Path::SbGemm => sb_gemm(jobs, x, n),
        _ => unreachable!("not a GEMM path: {p:?}"),
    }
}

thread_local! {
    pub(super) static RBUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Builds the packed copy of every job's weights that this thread's decode kernels will read
/// anyway, before a GEMM reads the stored rows: from then on only that copy is read (the
/// file's pages of the original are handed back), so a model holds its weights once.
pub(super) fn pack_for_decode(jobs: &[Job]) {
    for j in jobs {
        if packed::packs(j.w.dtype) && j.w.packed_if_built().is_none() && packs_here(j.w.dtype) {
            j.w.packed(packed::rows_by_8);
        }
    }
}

/// [`with_stored_rows`], or, when `skip`, `f` with a null pointer (the caller reads the
/// packed copy itself).
pub(super) fn with_stored_rows_unless<R>(
    w: &Tensor,
    range: std::ops::Range<usize>,
    skip: bool,
    f: impl FnOnce(*const u8) -> R,
) -> R {
    if skip {
        f(std::ptr::null())
    } else {
        with_stored_rows(w, range, f)
    }
}

/// Row `i` of `w` in its stored layout, read from its packed copy once it has one (so the
/// file's pages that the copy handed back are not read again): `buf` is scratch space.
pub(crate) fn stored_row<'a>(w: &'a Tensor, i: usize, buf: &'a mut Vec<u8>) -> &'a [u8] {
    let rb = w.row_bytes();
    match w.packed_if_built() {
        Some(p) if packed::packs(w.dtype) => {
            let g0 = i / packed::GROUP * packed::GROUP;
            let rows = packed::GROUP.min(w.n_rows() - g0);
            grow(buf, rows * rb);
            packed::stored_rows(w, p, g0, rows, buf);
            &buf[(i - g0) * rb..(i - g0 + 1) * rb]
        }
        _ => w.row(i),
    }
}

/// Calls `f` with a pointer to weight rows `range` of `w` in the stored layout: the tensor's
/// own bytes or, once it has a packed copy, those rows rebuilt from it (`range` starts at a
/// multiple of 8: the GEMM tiles do).
pub(super) fn with_stored_rows<R>(
    w: &Tensor,
    range: std::ops::Range<usize>,
    f: impl FnOnce(*const u8) -> R,
) -> R {
    let rb = w.row_bytes();
    match w.packed_if_built() {
        Some(p) if packed::packs(w.dtype) => RBUF.with(|b| {
            let mut b = b.borrow_mut();
            grow(&mut b, range.len() * rb);
            packed::stored_rows(w, p, range.start, range.len(), &mut b);
            f(b.as_ptr())
        }),
        // SAFETY: the rows of `range` lie inside the tensor's n_rows·rb bytes (the callers'
        // ranges are within its rows).
        _ => f(unsafe { w.data().as_ptr().add(range.start * rb) }),
    }
}

thread_local! {
    pub(super) static GBUF: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    pub(super) static XPACK: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// The many-row exact path of [`matmul`]: the activation rows are packed once into blocks of
/// `g.tb` rows ([`GemmArgs`]); each task dequantizes `GEMM_TILE_ROWS` weight rows into f32
/// once and multiplies them by every block.
pub(super) fn gemm(jobs: &[Job], x: &[f32], n: usize) {
    pack_for_decode(jobs);
    let g = jobs[0].kern.gemm.expect("the GEMM path");
    let k = jobs[0].w.row_len();
    let narrow = n <= NARROW_ROWS;
    let tb = g.tb;
    // The narrow kernel reads the activation rows as they are.
    let blocks = if narrow { 0 } else { n.div_ceil(tb) };
    let mut xpack = XPACK.with(|b| std::mem::take(&mut *b.borrow_mut()));
    grow(&mut xpack, blocks * tb * k);
    let pp = SendPtr(xpack.as_mut_ptr());
    parallel_for(blocks, 1, &|range| {
        let pp = &pp;
        for b in range {
            // SAFETY: block b's tb·k f32 lie inside xpack and only this task writes them.
            let dst = unsafe { std::slice::from_raw_parts_mut(pp.0.add(b * tb * k), tb * k) };
            let rows = tb.min(n - b * tb);
            if let Some(p) = g.pack {
                // SAFETY: x holds rows·k f32 from row b·tb; dst holds tb·k f32; the packer
                // was picked for an available ISA with this tb.
                unsafe { p(x.as_ptr().add(b * tb * k), k, rows, dst.as_mut_ptr()) };
                continue;
            }
            if rows < tb {
                dst.fill(0.0);
            }
            // 16 columns at a time: contiguous reads of each row, writes within a
            // 16·tb-float tile.
            for i0 in (0..k).step_by(16) {
                let w = 16.min(k - i0);
                let tile = &mut dst[i0 * tb..(i0 + w) * tb];
                for j in 0..rows {
                    let src = &x[(b * tb + j) * k + i0..][..w];
                    for (d, &v) in tile.iter_mut().skip(j).step_by(tb).zip(src) {
                        *d = v;
                    }
                }
            }
        }
    });
    let xp = SendPtr(if narrow {
        x.as_ptr() as *mut f32
    } else {
        xpack.as_mut_ptr()
    });
    for_each_tile(jobs, &|job, range| {
        let xp = &xp;
        let g = job.kern.gemm.expect("the GEMM path");
        let m = job.w.n_rows();
        let rb = job.w.dtype.bytes_for(k).expect("checked by matmul_kernel");
        let rows = range.len();
        // A packed copy that the format's group dequantizer reads in place: whole groups
        // from it (tiles start at multiples of 8), rows past the last whole group as stored.
        let groups = g.deq_group.zip(
            job.w
                .packed_if_built()
                .filter(|_| packed::packs(job.w.dtype)),
        );
        let in_groups = groups.map_or(0, |_| {
            (job.w.n_rows() / packed::GROUP * packed::GROUP).clamp(range.start, range.end)
                - range.start
        });
        with_stored_rows_unless(job.w, range.clone(), groups.is_some(), |wp| {
            GBUF.with(|buf| {
                let mut buf = buf.borrow_mut();
                let (wf, ws) = match (g.deq, groups) {
                    (Some(deq), Some((deq_group, p))) => {
                        let ws = k + 16;
                        grow(&mut buf, rows * ws);
                        for r in (0..in_groups).step_by(packed::GROUP) {
                            // SAFETY: rows range.start + r.. form a whole group of the packed
                            // copy (range.start is a multiple of 8 and r < in_groups), which
                            // holds the tensor's m·rb bytes; buf holds rows·ws f32; the
                            // dequantizer was picked for this dtype on an available ISA.
                            unsafe {
                                deq_group(
                                    p.as_ptr().add((range.start + r) * rb),
                                    k,
                                    buf.as_mut_ptr().add(r * ws),
                                    ws,
                                )
                            };
                        }
                        for r in in_groups..rows {
                            // SAFETY: rows past the last whole group are stored as they were
                            // in the packed copy; buf as above.
                            unsafe {
                                deq(
                                    p.as_ptr().add((range.start + r) * rb),
                                    buf.as_mut_ptr().add(r * ws),
                                    k,
                                )
                            };
                        }
                        (buf.as_ptr(), ws)
                    }
                    (Some(deq), None) => {
                        // Rows 16 f32 longer than k: rows a multiple of 4 KiB apart would all
                        // fall in the same L1 sets while the kernel reads them side by side.
                        let ws = k + 16;
                        grow(&mut buf, rows * ws);
                        for r in 0..rows {
                            // SAFETY: `wp` holds the tile's rows·rb stored bytes
                            // (`with_stored_rows`); buf holds rows·k f32; `deq` was picked for
                            // this dtype on an available ISA and k is whole blocks.
                            unsafe { deq(wp.add(r * rb), buf.as_mut_ptr().add(r * ws), k) };
                        }
                        (buf.as_ptr(), ws)
                    }
                    // F32 rows are used in place: rb = 4k bytes each, the tile's rows at `wp`.
                    (None, _) => (wp as *const f32, k),
                };
                let a = GemmArgs {
                    w: wf,
                    w_stride: ws,
                    rows,
                    x: xp.0,
                    n,
                    k,
                    // SAFETY: columns range of every output row t (out has n·m elements).
                    out: unsafe { job.out.0.add(range.start) },
                    out_stride: m,
                };
                // SAFETY: the GemmFn contract: weights (buf or F32 rows) hold rows·k f32 at
                // stride ws, x holds ceil(n/tb) packed blocks of tb·k f32 (the narrow kernel: n
                // plain rows of k, n ≤ 8), out[t·m + r] for r in this task's range is written
                // by this task alone; rows ≥ 1 and n ≥ 1.
                unsafe {
                    if narrow {
                        (g.narrow)(&a)
                    } else {
                        (g.tile)(&a)
                    }
                };
            })
        });
    });
    XPACK.with(|b| *b.borrow_mut() = xpack);
}

thread_local! {
    pub(super) static IBUF: RefCell<(Vec<u8>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
    pub(super) static XIPACK: RefCell<(Vec<u8>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// [`sb_gemm`]'s Q8_K rows and their packed blocks (codes, `dx`, `ys`).
#[cfg(target_arch = "x86_64")]
type SbPack = (Vec<u8>, Vec<u8>, Vec<f32>, Vec<i32>);

#[cfg(target_arch = "x86_64")]
thread_local! {
    static SBPACK: RefCell<SbPack> =
        const { RefCell::new((Vec::new(), Vec::new(), Vec::new(), Vec::new())) };
    /// [`sb_gemm`]'s unpacked weight tile (codes; scales and mins; `dw` and `dmin`).
    static SBBUF: RefCell<(Vec<u8>, Vec<i32>, Vec<f32>)> =
        const { RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
}

/// The super-block i-quants' many-row path ([`int8sb`]): the activation rows quantized to
/// Q8_K once (by the matrix-vector path's own quantizer) and packed, then each task unpacks
/// `GEMM_TILE_ROWS` weight rows and multiplies them by every packed block.
#[cfg(target_arch = "x86_64")]
pub(super) fn sb_gemm(jobs: &[Job], x: &[f32], n: usize) {
    let isa = jobs[0].kern.isa;
    let k = jobs[0].w.row_len();
    let qb = DType::Q8K
        .bytes_for(k)
        .expect("super-block rows are whole Q8_K blocks (path)");
    let blocks = n.div_ceil(int8::TB);
    let (xb, db, yb) = int8sb::block_sizes(k);
    let (mut q, mut xq, mut dx, mut ys) = SBPACK.with(|b| std::mem::take(&mut *b.borrow_mut()));
    grow(&mut q, n * qb);
    quantize_rows(DType::Q8K, x, k, qb, qb, &mut q[..n * qb]);
    grow(&mut xq, blocks * xb);
    grow(&mut dx, blocks * db);
    grow(&mut ys, blocks * yb);
    let (xqp, dxp, ysp) = (
        SendPtr(xq.as_mut_ptr()),
        SendPtr(dx.as_mut_ptr()),
        SendPtr(ys.as_mut_ptr()),
    );
    let qp = SendPtr(q.as_mut_ptr());
    parallel_for(blocks, 1, &|range| {
        let (xqp, dxp, ysp, qp) = (&xqp, &dxp, &ysp, &qp);
        for b in range {
            let rows = int8::TB.min(n - b * int8::TB);
            // SAFETY: block b's outputs lie inside the buffers sized above and only this task
            // writes them; q holds n Q8_K rows of qb bytes, rows b·TB.. of which are read.
            unsafe {
                int8sb::pack_q8k(
                    qp.0.add(b * int8::TB * qb),
                    qb,
                    rows,
                    k,
                    xqp.0.add(b * xb),
                    dxp.0.add(b * db),
                    ysp.0.add(b * yb),
                )
            };
        }
    });
    let (xqp, dxp, ysp) = (
        SendPtr(xq.as_mut_ptr()),
        SendPtr(dx.as_mut_ptr()),
        SendPtr(ys.as_mut_ptr()),
    );
    for_each_tile(jobs, &|job, range| {
        let (xqp, dxp, ysp) = (&xqp, &dxp, &ysp);
        let m = job.w.n_rows();
        let dtype = job.w.dtype;
        let format = int8sb::format(dtype).expect("sbgemm formats have a decoder");
        let gemm = int8sb::gemm_fn(isa, format);
        let rb = dtype.bytes_for(k).expect("checked by matmul_kernel");
        let rows = range.len();
        // Code rows 64 bytes longer than k (see `gemm`'s f32 rows).
        let (cs, gs, ss) = (k + 64, k / 16, k / 256);
        with_stored_rows_unless(job.w, range.clone(), false, |wp| {
            SBBUF.with(|buf| {
                let mut buf = buf.borrow_mut();
                let (codes, ints, floats) = &mut *buf;
                grow(codes, rows * cs);
                grow(ints, 2 * rows * gs);
                grow(floats, 2 * rows * ss);
                let (sc, mn) = ints[..2 * rows * gs].split_at_mut(rows * gs);
                let (dw, dmin) = floats[..2 * rows * ss].split_at_mut(rows * ss);
                for r in 0..rows {
                    let u = int8sb::Unpacked {
                        codes: codes.as_mut_ptr().wrapping_add(r * cs),
                        sc: sc.as_mut_ptr().wrapping_add(r * gs),
                        dw: dw.as_mut_ptr().wrapping_add(r * ss),
                        mn: mn.as_mut_ptr().wrapping_add(r * gs),
                        dmin: dmin.as_mut_ptr().wrapping_add(r * ss),
                    };
                    // SAFETY: `wp` holds the tile's rows·rb stored bytes; `u` is row r of the
                    // buffers sized above; the CPU has AVX2 (the jobs' level is a VNNI one).
                    unsafe { (format.unpack)(wp.add(r * rb), k, &u) };
                }
                let a = int8sb::SbGemmArgs {
                    codes: codes.as_ptr(),
                    c_stride: cs,
                    sc: sc.as_ptr(),
                    dw: dw.as_ptr(),
                    mn: mn.as_ptr(),
                    dmin: dmin.as_ptr(),
                    rows,
                    xq: xqp.0,
                    dx: dxp.0,
                    ys: ysp.0,
                    n,
                    k,
                    // SAFETY: columns `range` of every output row (out has n·m elements).
                    out: unsafe { job.out.0.add(range.start) },
                    out_stride: m,
                };
                // SAFETY: the buffers hold what SbGemmArgs describes; out[t·m + r] for r in
                // this task's range is written by this task alone; rows ≥ 1, n ≥ 1; the
                // kernel's level is the jobs' (available: the kernel table's).
                unsafe { gemm(&a) };
            })
        });
    });
    SBPACK.with(|b| *b.borrow_mut() = (q, xq, dx, ys));
}

/// Fast mode's many-row path ([`int8`]): activation rows quantized to 8 bits and packed once,
/// then each task unpacks `GEMM_TILE_ROWS` weight rows to 8-bit codes and multiplies them by
/// every packed block with `vpdpbusd` (AVX-VNNI, AVX-512 VNNI) or `vpmaddubsw` (AVX2) — the
/// jobs' x86 level ([`int8::gemm_fn`]).
#[cfg(target_arch = "x86_64")]
pub(super) fn igemm(jobs: &[Job], x: &[f32], n: usize) {
    pack_for_decode(jobs);
    let isa = jobs[0].kern.isa;
    let k = jobs[0].w.row_len();
    let pack = int8::gemm_fn(isa, jobs[0].w.dtype).pack;
    let blocks = n.div_ceil(int8::TB);
    let (xb, fb) = int8::block_sizes(k);
    let (mut xq, mut xf) = XIPACK.with(|b| std::mem::take(&mut *b.borrow_mut()));
    grow(&mut xq, blocks * xb);
    grow(&mut xf, 2 * blocks * fb);
    let (xqp, xfp) = (SendPtr(xq.as_mut_ptr()), SendPtr(xf.as_mut_ptr()));
    parallel_for(blocks, 1, &|range| {
        let (xqp, xfp) = (&xqp, &xfp);
        for b in range {
            let rows = int8::TB.min(n - b * int8::TB);
            // SAFETY: block b's bytes and f32 (dx in the first half of xf, sx in the second)
            // lie inside the buffers sized above and only this task writes them; x holds
            // rows·k f32 from row b·TB; k is a multiple of 32; `pack` is the packer of the
            // jobs' level, which the CPU has (the kernel table's).
            unsafe {
                pack(
                    x.as_ptr().add(b * int8::TB * k),
                    rows,
                    k,
                    xqp.0.add(b * xb),
                    xfp.0.add(b * fb),
                    xfp.0.add((blocks + b) * fb),
                )
            };
        }
    });
    let (xqp, xfp) = (SendPtr(xq.as_mut_ptr()), SendPtr(xf.as_mut_ptr()));
    for_each_tile(jobs, &|job, range| {
        let (xqp, xfp) = (&xqp, &xfp);
        let m = job.w.n_rows();
        let dtype = job.w.dtype;
        let fns = int8::gemm_fn(isa, dtype);
        let rb = dtype.bytes_for(k).expect("checked by matmul_kernel");
        let rows = range.len();
        // Code rows 64 bytes longer than k (see `gemm`'s f32 rows).
        let cs = k + 64;
        let gs = k / 16;
        // Q8_0 tiles of whole packed groups unpack straight from the packed copy.
        let q8_groups = match job.w.packed_if_built() {
            Some(p)
                if dtype == DType::Q8_0
                    && range.start.is_multiple_of(8)
                    && rows.is_multiple_of(8)
                    && range.end <= m / 8 * 8 =>
            {
                Some(p)
            }
            _ => None,
        };
        with_stored_rows_unless(job.w, range.clone(), q8_groups.is_some(), |wp| {
            IBUF.with(|buf| {
                let mut buf = buf.borrow_mut();
                let (codes, f) = &mut *buf;
                grow(codes, rows * cs);
                grow(f, 2 * rows * gs);
                let (dw, cw) = f[..2 * rows * gs].split_at_mut(rows * gs);
                if let Some(p) = q8_groups {
                    for g in 0..rows / 8 {
                        // SAFETY: rows range.start + 8g .. +8 form a whole packed group
                        // (checked above: whole groups inside the tensor), rb bytes each, in
                        // the copy; the outputs are rows 8g..8g+8 of the buffers sized above.
                        unsafe {
                            int8::unpack_q8_0_group(
                                p.as_ptr().add((range.start + 8 * g) * rb),
                                k,
                                codes.as_mut_ptr().add(8 * g * cs),
                                cs,
                                dw.as_mut_ptr().add(8 * g * gs),
                                cw.as_mut_ptr().add(8 * g * gs),
                                gs,
                            )
                        };
                    }
                }
                // Otherwise every row from the stored layout.
                let stored = if q8_groups.is_some() { 0 } else { rows };
                for r in 0..stored {
                    // SAFETY: `wp` holds the tile's rows·rb stored bytes (`with_stored_rows`);
                    // the outputs are row r of buffers sized above; `dtype` is supported (igemm
                    // flag).
                    unsafe {
                        int8::unpack(
                            dtype,
                            wp.add(r * rb),
                            k,
                            codes.as_mut_ptr().add(r * cs),
                            dw.as_mut_ptr().add(r * gs),
                            cw.as_mut_ptr().add(r * gs),
                            fns.small,
                        )
                    };
                }
                let a = int8::IGemmArgs {
                    codes: codes.as_ptr(),
                    c_stride: cs,
                    dw: dw.as_ptr(),
                    cw: cw.as_ptr(),
                    g_stride: gs,
                    rows,
                    xq: xqp.0,
                    dx: xfp.0,
                    sx: xfp.0.wrapping_add(blocks * fb),
                    n,
                    k,
                    // SAFETY: columns `range` of every output row (out has n·m elements).
                    out: unsafe { job.out.0.add(range.start) },
                    out_stride: m,
                };
                // SAFETY: the buffers hold what IGemmArgs describes; out[t·m + r] for r in this
                // task's range is written by this task alone; rows ≥ 1, n ≥ IGEMM_MIN_ROWS;
                // the codes are what `fns.gemm` takes (`fns.small`).
                unsafe { (fns.gemm)(&a) };
            })
        });
    });
    XIPACK.with(|b| *b.borrow_mut() = (xq, xf));
}

/// The 8-bit format fast mode multiplies `dtype` weights with for `n` activation rows on
/// `isa`, if any (tests use it to build the effective activations).
#[cfg(test)]
pub(super) fn fast_act_for(isa: Isa, dtype: DType, n: usize, k: usize) -> Option<DType> {
    #[cfg(target_arch = "x86_64")]
    if dtype == DType::BF16 && isa == Isa::Avx512 && bf16::pays() && n >= BGEMM_MIN_ROWS {
        return Some(DType::BF16);
    }
    let ad = act_format_on(isa, dtype)?;
    #[cfg(target_arch = "x86_64")]
    if int8::supports(isa, dtype) && n >= IGEMM_MIN_ROWS && k.is_multiple_of(32) {
        return Some(DType::Q8_0);
    }
    #[cfg(target_arch = "x86_64")]
    if int8sb::supports(isa, dtype) && n >= IGEMM_MIN_ROWS && k.is_multiple_of(256) {
        return Some(DType::Q8K);
    }
    if isa.is_x86() && n >= GEMM_MIN_ROWS {
        // The f32 GEMM.
        return None;
    }
    let _ = (isa, n, k);
    Some(ad)
}
