//! Time of one decode pass of n rows of one sequence (a speculative verify pass: every row's
//! logits) at a cache depth, f16 KV as `lone bench`, best and mean of REPS passes, the cache
//! truncated back after each: what a verify pass costs against one decode step.
//!
//! `cargo run --release -p lone-core --example verify_cost -- MODEL [DEPTH [ROWS,… [REPS]]]`
//! (defaults 300, 1,2,4,8,12,16, 20).
use lone_core::models::{Batch, Model};
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mut model = Model::load(std::path::Path::new(&args[1])).expect("model");
    model
        .set_kv_type(lone_core::cache::KvType::F16)
        .expect("f16 KV");
    let depth: usize = args.get(2).map(|s| s.parse().unwrap()).unwrap_or(300);
    let mut caches = vec![model.new_cache()];
    let prompt: Vec<u32> = (0..depth as u32).map(|i| 100 + (i * 37) % 5000).collect();
    model
        .forward(&Batch::for_sequence(0, 0, &prompt, false), &mut caches)
        .unwrap();
    let ns: Vec<usize> = match args.get(3) {
        Some(s) => s.split(',').map(|x| x.parse().unwrap()).collect(),
        None => vec![1, 2, 4, 8, 12, 16],
    };
    let reps: usize = args.get(4).map(|s| s.parse().unwrap()).unwrap_or(20);
    for n in ns {
        let mut best = f64::MAX;
        let mut sum = 0.0;
        for _ in 0..reps {
            let mut b = Batch::default();
            for j in 0..n {
                b.push(0, depth + j, 200 + j as u32, true);
            }
            b.score_all = n > 1;
            let t = Instant::now();
            model.forward(&b, &mut caches).unwrap();
            let e = t.elapsed().as_secs_f64() * 1e3;
            best = best.min(e);
            sum += e;
            caches[0].truncate(depth);
        }
        println!(
            "rows {n:2}: best {best:6.2} ms, mean {:6.2} ms",
            sum / reps as f64
        );
    }
}
