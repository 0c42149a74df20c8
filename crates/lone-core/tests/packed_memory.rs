//! A model whose weights the decode kernels repack (Q4_0/Q4_1/Q5_0/Q5_1/Q4_K, and Q8_0 on the
//! VNNI levels, rows by 8) holds
//! them in memory once: after a prompt and some decoding, the file's mapping keeps resident
//! only the tensors that are not repacked. Before, the prompt GEMM kept reading the file's
//! copy, so both stayed resident (LFM2-350M Q4_0: peak RSS 409 MiB, now 256).
//!
//! (Llama-family Q/K matrices are reordered into memory at load, so their file pages go at
//! once; of those the reordered copy and the packed one both stay: 6 % of SmolLM2's weights.)
//!
//! Reference: the kernel's own count of the process's resident pages of the file
//! (`/proc/self/smaps`), against the tensor sizes the GGUF header gives.

mod common;

use lone_core::engine::{GenRequest, Scheduler};
use lone_core::kernels::{self, Mode};
use lone_core::loader::gguf::GgufFile;
use lone_core::sampler::{Sampler, SamplingParams};
use lone_core::tensor::DType;
use lone_core::Model;

/// Resident bytes of the mappings of `path` in this process.
fn resident_bytes_of(path: &std::path::Path) -> usize {
    let smaps = std::fs::read_to_string("/proc/self/smaps").expect("Linux /proc/self/smaps");
    let name = path.canonicalize().unwrap();
    let name = name.to_str().unwrap();
    let mut inside = false;
    let mut kb = 0;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if first.contains('-') && first.chars().next().is_some_and(|c| c.is_ascii_hexdigit()) {
            inside = line.trim_end().ends_with(name);
        } else if inside {
            if let Some(v) = line.strip_prefix("Rss:") {
                kb += v
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<usize>()
                    .unwrap();
            }
        }
    }
    kb * 1024
}

#[test]
fn repacked_weights_are_resident_once() {
    // Every x86 level and aarch64's dotprod level read rows by 8.
    if matches!(kernels::isa(), kernels::Isa::Scalar | kernels::Isa::Neon) {
        eprintln!(
            "no rows-by-8 kernels on {:?}: nothing is repacked",
            kernels::isa()
        );
        return;
    }
    let path = common::default_model();
    let g = GgufFile::open(&path).unwrap();
    let (mut packed, mut kept) = (0usize, 0usize);
    let count = g.tensors.len();
    // The header (metadata: the tokenizer's vocabulary and merges) before the first tensor.
    let header = g.tensors.iter().map(|t| t.offset).min().unwrap_or(0);
    // Q8_0 is packed on the VNNI levels (its whole-byte codes need `vpdpbusd`); the tied
    // embedding's rows that the prompt looks up come back from the file (a few pages).
    let q8_packed = matches!(kernels::isa(), kernels::Isa::Avx512 | kernels::Isa::AvxVnni);
    for t in &g.tensors {
        if matches!(
            t.dtype,
            DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q4K
        ) || (q8_packed && t.dtype == DType::Q8_0)
        {
            packed += t.len;
        } else {
            kept += t.len;
        }
    }
    drop(g);
    assert!(packed > 2 * kept, "the test needs a mostly Q4_1 file");
    let mut m = Model::load(&path).unwrap();
    m.compute.mode = Some(Mode::Auto);
    let prompt: Vec<u32> = (0..40u32).map(|i| 100 + i * 37).collect();
    let mut s = Scheduler::new(vec![m.new_cache()], 4096, Vec::new(), None);
    let req = GenRequest {
        prompt: prompt.clone(),
        max_tokens: 8,
        params: SamplingParams::greedy(),
        ignore_eos: true,
        ..Default::default()
    };
    let slot = s
        .admit(req, Sampler::new(SamplingParams::greedy()), None)
        .unwrap();
    let mut steps = 0;
    while s.is_active(slot) {
        s.step(&m, &mut |_, _| true).unwrap();
        steps += 1;
    }
    assert!(steps >= 8, "a prompt step and decode steps ran");
    // A second prompt (its GEMM must read the packed copy, not the file's pages again).
    let mut c = m.new_cache();
    lone_core::generate::prefill(&m, &mut c, &prompt[..30], false).unwrap();
    let resident = resident_bytes_of(&path);
    // The header and what is not repacked (the Q8_0 embedding, norms), plus at most the two
    // partial pages at each end of every repacked tensor.
    let slack = 2 * 4096 * count + (1 << 20);
    assert!(
        resident <= header + kept + slack,
        "{} MiB of the file resident; its header and the tensors kept in the file's layout \
         take {} MiB (and the repacked ones {} MiB, which should have been handed back)",
        resident >> 20,
        (header + kept) >> 20,
        packed >> 20
    );
}
