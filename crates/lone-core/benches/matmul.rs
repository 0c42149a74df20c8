//! Matrix-vector and matrix-matrix throughput per weight format at LFM2-350M-like shapes,
//! reported as weight bytes per second (divan's `bytes/s` column; the machine's read bandwidth
//! is the ceiling for decode). Shapes are `m×k` = output rows × row length:
//! 1024×4608 (FFN down), 4608×1024 (FFN up/gate), 65536×1024 (tied LM head).
//!
//! `cargo bench -p lone-core --bench matmul` (filter: `-- matvec`, `-- 'matmul_n8'`, …).
//! `LONE_ISA=avx2` forces a kernel family; `LONE_EXACT=1` benchmarks exact mode.

use divan::counter::BytesCount;
use divan::Bencher;
use lone_core::kernels;
use lone_core::tensor::{DType, Tensor};

fn main() {
    if std::env::var("LONE_EXACT").is_ok_and(|v| v == "1") {
        kernels::set_exact(true);
    }
    eprintln!(
        "kernels: {:?}, {} threads, exact = {}",
        kernels::isa(),
        kernels::threads(),
        kernels::exact()
    );
    divan::main();
}

const FORMATS: [DType; 10] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::Q8_0,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q4K,
    DType::Q5K,
    DType::Q6K,
];

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Random quants with moderate, finite scales.
fn weights(dtype: DType, m: usize, k: usize) -> Tensor {
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let len = dtype.bytes_for(m * k).unwrap();
    let mut w = Vec::with_capacity(len + 8);
    while w.len() < len {
        w.extend_from_slice(&rng.next().to_le_bytes());
    }
    w.truncate(len);
    let h = half::f16::from_f32(0.01).to_le_bytes();
    for b in w.chunks_mut(dtype.block_bytes()) {
        match dtype {
            DType::F32 => b[3] &= 0xbf,
            DType::F16 | DType::BF16 => b[1] &= 0xbf,
            DType::Q4_0 | DType::Q5_0 | DType::Q8_0 => b[0..2].copy_from_slice(&h),
            DType::Q4_1 | DType::Q4K | DType::Q5K => {
                b[0..2].copy_from_slice(&h);
                b[2..4].copy_from_slice(&h);
            }
            DType::Q6K => b[208..210].copy_from_slice(&h),
            _ => unreachable!(),
        }
    }
    Tensor::from_bytes(dtype, vec![m, k], w)
}

fn run(b: Bencher, dtype: DType, m: usize, k: usize, n: usize) {
    let w = weights(dtype, m, k);
    let x: Vec<f32> = (0..n * k)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    let mut out = vec![0.0f32; n * m];
    b.counter(BytesCount::new(w.data().len()))
        .bench_local(|| kernels::matmul(&w, &x, n, &mut out));
}

macro_rules! shape {
    ($name:ident, $m:expr, $k:expr, $n:expr, $samples:expr) => {
        #[divan::bench(args = FORMATS, sample_count = $samples)]
        fn $name(b: Bencher, d: &DType) {
            run(b, *d, $m, $k, $n);
        }
    };
}

mod matvec {
    use super::*;
    shape!(m1024_k4608, 1024, 4608, 1, 200);
    shape!(m4608_k1024, 4608, 1024, 1, 200);
    shape!(m65536_k1024, 65536, 1024, 1, 30);
}

mod matmul_n4 {
    use super::*;
    shape!(m1024_k4608, 1024, 4608, 4, 100);
    shape!(m4608_k1024, 4608, 1024, 4, 100);
    shape!(m65536_k1024, 65536, 1024, 4, 20);
}

mod matmul_n8 {
    use super::*;
    shape!(m1024_k4608, 1024, 4608, 8, 50);
    shape!(m4608_k1024, 4608, 1024, 8, 50);
    shape!(m65536_k1024, 65536, 1024, 8, 10);
}

mod matmul_n16 {
    use super::*;
    shape!(m1024_k4608, 1024, 4608, 16, 50);
    shape!(m4608_k1024, 4608, 1024, 16, 50);
}

mod matmul_n128 {
    use super::*;
    shape!(m1024_k4608, 1024, 4608, 128, 10);
    shape!(m4608_k1024, 4608, 1024, 128, 10);
    shape!(m65536_k1024, 65536, 1024, 128, 3);
}

/// The pool's fixed cost: an op with nothing to do on every thread.
#[divan::bench(sample_count = 1000)]
fn empty_parallel_op(b: Bencher) {
    b.bench(|| kernels::parallel_for(kernels::threads(), 1, &|_| {}));
}
