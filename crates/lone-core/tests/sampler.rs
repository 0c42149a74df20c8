//! Sampler tests. Expected values are computed here independently (by hand
//! or with straightforward reference code), never by calling the sampler.

use lone_core::sampler::{
    argmax, log_softmax, logsumexp, token_logprob, top_logprobs, Sampler, SamplingParams,
};
use std::collections::BTreeSet;

const NAN: f32 = f32::NAN;
const INF: f32 = f32::INFINITY;

/// Tiny deterministic generator for test logits (independent of `rand`).
struct Lcg(u64);
impl Lcg {
    fn next_f32(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 8.0 - 4.0
    }
    fn logits(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next_f32()).collect()
    }
}

fn params() -> SamplingParams {
    SamplingParams {
        seed: Some(1234),
        ..SamplingParams::default()
    }
}

fn sampler(p: SamplingParams) -> Sampler {
    Sampler::new(p)
}

/// Reference softmax in f64.
fn softmax(logits: &[f64]) -> Vec<f64> {
    let m = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = logits.iter().map(|l| (l - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|x| x / s).collect()
}

fn frequencies(s: &mut Sampler, logits: &[f32], n: usize) -> Vec<f64> {
    let mut counts = vec![0usize; logits.len()];
    for _ in 0..n {
        counts[s.sample(logits, &[]) as usize] += 1;
    }
    counts.iter().map(|&c| c as f64 / n as f64).collect()
}

fn cand_set(s: &mut Sampler, logits: &[f32], history: &[u32]) -> BTreeSet<u32> {
    s.candidates(logits, history).iter().map(|c| c.0).collect()
}

fn set(ids: &[u32]) -> BTreeSet<u32> {
    ids.iter().copied().collect()
}

fn ln_probs(p: &[f64]) -> Vec<f32> {
    p.iter().map(|x| x.ln() as f32).collect()
}

fn assert_close(got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = if w.is_infinite() {
            g == w
        } else {
            (g - w).abs() <= tol
        };
        assert!(
            ok,
            "index {i}: got {g}, want {w} (all: {got:?} vs {want:?})"
        );
    }
}

// ---------------------------------------------------------------- greedy

#[test]
fn argmax_first_max_and_nan_safe() {
    assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
    assert_eq!(argmax(&[5.0, 1.0, 5.0]), 0);
    assert_eq!(argmax(&[-3.0, -1.0, -2.0]), 1);
    assert_eq!(argmax(&[NAN, 1.0, NAN, 0.5]), 1);
    assert_eq!(argmax(&[NAN, -INF, -5.0]), 2);
    assert_eq!(argmax(&[1.0, INF, INF]), 1);
    assert_eq!(argmax(&[NAN, NAN]), 0);
    assert_eq!(argmax(&[-INF, -INF, -INF]), 0);
    assert_eq!(argmax(&[]), 0);
}

#[test]
fn greedy_default_is_argmax() {
    let mut rng = Lcg(7);
    let mut s = sampler(SamplingParams::default());
    for _ in 0..50 {
        let logits = rng.logits(300);
        // Reference: first index of the maximum.
        let mut best = 0;
        for i in 1..logits.len() {
            if logits[i] > logits[best] {
                best = i;
            }
        }
        assert_eq!(s.sample(&logits, &[]), best as u32);
    }
    assert_eq!(s.sample(&[0.5, 2.0, -1.0, 2.0], &[]), 1, "ties → lowest id");
    assert_eq!(s.sample(&[2.0, 2.0], &[]), 0);
}

#[test]
fn truncation_to_one_token_is_greedy() {
    let mut rng = Lcg(99);
    for (i, p) in [
        SamplingParams {
            top_k: 1,
            temperature: 5.0,
            ..params()
        },
        SamplingParams {
            top_p: 1e-6,
            temperature: 1.5,
            ..params()
        },
        SamplingParams {
            min_p: 1.0,
            temperature: 3.0,
            ..params()
        },
    ]
    .into_iter()
    .enumerate()
    {
        let mut s = sampler(p);
        for _ in 0..100 {
            let logits = rng.logits(64);
            assert_eq!(s.sample(&logits, &[]), argmax(&logits), "case {i}");
        }
    }
    // min_p = 1 keeps exactly the maximum (all of it when tied).
    let mut s = sampler(SamplingParams {
        min_p: 1.0,
        temperature: 1.0,
        ..params()
    });
    assert_eq!(cand_set(&mut s, &[1.0, 3.0, 2.0, 3.0], &[]), set(&[1, 3]));
}

// ---------------------------------------------------------- determinism

#[test]
fn seeded_sampling_is_deterministic() {
    let logits = Lcg(3)
        .logits(32)
        .iter()
        .map(|l| l * 0.2)
        .collect::<Vec<_>>();
    let run = |seed| {
        let mut s = sampler(SamplingParams {
            temperature: 1.0,
            seed: Some(seed),
            ..SamplingParams::default()
        });
        assert_eq!(s.seed(), seed);
        (0..50).map(|_| s.sample(&logits, &[])).collect::<Vec<_>>()
    };
    let a = run(42);
    assert_eq!(a, run(42));
    assert_ne!(a, run(43));
    assert!(
        a.iter().collect::<BTreeSet<_>>().len() > 5,
        "flat distribution should give varied tokens: {a:?}"
    );

    // reseed restarts the stream
    let mut s = sampler(SamplingParams {
        temperature: 1.0,
        seed: Some(7),
        ..SamplingParams::default()
    });
    let first: Vec<u32> = (0..20).map(|_| s.sample(&logits, &[])).collect();
    s.reseed(7);
    let again: Vec<u32> = (0..20).map(|_| s.sample(&logits, &[])).collect();
    assert_eq!(first, again);

    // Unseeded samplers draw (and report) a seed.
    let s1 = sampler(SamplingParams::default());
    let s2 = sampler(SamplingParams::default());
    assert_ne!(s1.seed(), s2.seed());
}

// --------------------------------------------------------- distributions

const N: usize = 20_000;

#[test]
fn temperature_one_matches_softmax() {
    let raw = [1.0, 2.0, 0.5, -1.0];
    // softmax by hand: e^1, e^2, e^0.5, e^-1 over their sum
    let e: Vec<f64> = raw.iter().map(|&x: &f64| x.exp()).collect();
    let z: f64 = e.iter().sum();
    let want: Vec<f64> = e.iter().map(|x| x / z).collect();
    let logits: Vec<f32> = raw.iter().map(|&x| x as f32).collect();
    let mut s = sampler(SamplingParams {
        temperature: 1.0,
        ..params()
    });
    let got = frequencies(&mut s, &logits, N);
    for i in 0..4 {
        assert!(
            (got[i] - want[i]).abs() < 0.015,
            "token {i}: {got:?} vs {want:?}"
        );
    }
}

#[test]
fn temperature_scales_logits() {
    let raw = [1.0f64, 2.0, 0.5, -1.0];
    for t in [0.5f64, 2.0] {
        let want = softmax(&raw.iter().map(|l| l / t).collect::<Vec<_>>());
        let logits: Vec<f32> = raw.iter().map(|&x| x as f32).collect();
        let mut s = sampler(SamplingParams {
            temperature: t as f32,
            ..params()
        });
        let got = frequencies(&mut s, &logits, N);
        for i in 0..4 {
            assert!(
                (got[i] - want[i]).abs() < 0.015,
                "T={t} token {i}: {got:?} vs {want:?}"
            );
        }
    }
}

#[test]
fn top_k_keeps_top_two_with_their_ratio() {
    let logits = [0.0, 2.0, 1.0, 1.5];
    let mut s = sampler(SamplingParams {
        temperature: 1.0,
        top_k: 2,
        ..params()
    });
    assert_eq!(cand_set(&mut s, &logits, &[]), set(&[1, 3]));
    let got = frequencies(&mut s, &logits, N);
    assert_eq!(got[0], 0.0);
    assert_eq!(got[2], 0.0);
    let ratio = got[1] / got[3];
    let want = 0.5f64.exp(); // e^2 / e^1.5
    assert!((ratio / want - 1.0).abs() < 0.05, "{ratio} vs {want}");
    // top_k beyond the vocabulary is a no-op
    let mut s = sampler(SamplingParams {
        temperature: 1.0,
        top_k: 10,
        ..params()
    });
    assert_eq!(cand_set(&mut s, &logits, &[]), set(&[0, 1, 2, 3]));
}

#[test]
fn top_p_keeps_smallest_set_reaching_p() {
    // Probabilities in shuffled id order: id1 .5, id3 .3, id2 .15, id0 .05.
    let logits = ln_probs(&[0.05, 0.5, 0.15, 0.3]);
    let cases: [(f32, &[u32]); 5] = [
        (0.4, &[1]),           // .5 >= .4
        (0.75, &[1, 3]),       // .5 < .75 <= .8
        (0.85, &[1, 3, 2]),    // .8 < .85 <= .95
        (0.97, &[0, 1, 2, 3]), // .95 < .97
        (1.0, &[0, 1, 2, 3]),  // off
    ];
    for (p, want) in cases {
        let mut s = sampler(SamplingParams {
            temperature: 1.0,
            top_p: p,
            ..params()
        });
        assert_eq!(cand_set(&mut s, &logits, &[]), set(want), "top_p={p}");
    }
    // Exact boundary: four equal tokens, p = .5 → cumulative .25, .5 ≥ .5
    // stops at two (llama.cpp's `>=`); equal logits go by lower id.
    let mut s = sampler(SamplingParams {
        temperature: 1.0,
        top_p: 0.5,
        ..params()
    });
    assert_eq!(cand_set(&mut s, &[0.0; 4], &[]), set(&[0, 1]));
    // Sampling renormalises over the kept set: .5/.8 and .3/.8.
    let mut s = sampler(SamplingParams {
        temperature: 1.0,
        top_p: 0.75,
        ..params()
    });
    let got = frequencies(&mut s, &logits, N);
    assert_eq!(got[0] + got[2], 0.0, "{got:?}");
    assert!((got[1] - 0.625).abs() < 0.015, "{got:?}");
    assert!((got[3] - 0.375).abs() < 0.015, "{got:?}");
    // Temperature is applied after top-p: same set, flatter split.
    let mut s = sampler(SamplingParams {
        temperature: 2.0,
        top_p: 0.75,
        ..params()
    });
    let got = frequencies(&mut s, &logits, N);
    let (a, b) = (0.5f64.sqrt(), 0.3f64.sqrt());
    assert_eq!(got[0] + got[2], 0.0, "{got:?}");
    assert!((got[1] - a / (a + b)).abs() < 0.015, "{got:?}");
}

#[test]
fn top_p_uses_probabilities_renormalised_after_top_k() {
    let logits = ln_probs(&[0.4, 0.3, 0.2, 0.1]);
    // After top_k=2: .4/.7 = .571, .3/.7 = .429.
    let mut s = sampler(SamplingParams {
        temperature: 1.0,
        top_k: 2,
        top_p: 0.55,
        ..params()
    });
    assert_eq!(cand_set(&mut s, &logits, &[]), set(&[0]));
    let mut s = sampler(SamplingParams {
        temperature: 1.0,
        top_k: 2,
        top_p: 0.6,
        ..params()
    });
    assert_eq!(cand_set(&mut s, &logits, &[]), set(&[0, 1]));
}

#[test]
fn top_p_large_vocab_matches_reference() {
    let logits = Lcg(5).logits(3000);
    // Reference: full sort, cumulative normalised probabilities.
    let lf: Vec<f64> = logits.iter().map(|&l| l as f64).collect();
    let probs = softmax(&lf);
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| probs[b].partial_cmp(&probs[a]).unwrap());
    for p in [0.1f32, 0.5, 0.9, 0.99] {
        let mut want = BTreeSet::new();
        let mut cum = 0.0;
        for &i in &order {
            want.insert(i as u32);
            cum += probs[i];
            if cum >= p as f64 {
                break;
            }
        }
        let mut s = sampler(SamplingParams {
            temperature: 1.0,
            top_p: p,
            ..params()
        });
        let got = cand_set(&mut s, &logits, &[]);
        assert_eq!(got, want, "top_p={p}: {} vs {}", got.len(), want.len());
        for _ in 0..200 {
            assert!(want.contains(&s.sample(&logits, &[])));
        }
    }
}

#[test]
fn top_p_large_vocab_ties_go_to_lower_ids() {
    // 2000 tokens alternating logit 1 / 0. Each "1" token has probability
    // e / (1000 e + 1000); p = .3 needs ceil(.3 * 1000 * (1 + 1/e)) = 411 of them.
    let logits: Vec<f32> = (0..2000)
        .map(|i| if i % 2 == 0 { 1.0 } else { 0.0 })
        .collect();
    let want: BTreeSet<u32> = (0..411).map(|k| 2 * k).collect();
    let mut s = sampler(SamplingParams {
        temperature: 1.0,
        top_p: 0.3,
        ..params()
    });
    assert_eq!(cand_set(&mut s, &logits, &[]), want);

    // Same with one outlier on top (token 1999, logit 5), so the tied
    // tokens are no longer in id order when the boundary is resolved.
    // Mass: e^5 + 1000 e + 999; p = .4 needs e^5 + k e >= .4 * total.
    let mut logits = logits;
    logits[1999] = 5.0;
    let e = 1f64.exp();
    let total = 5f64.exp() + 1000.0 * e + 999.0;
    let k = ((0.4 * total - 5f64.exp()) / e).ceil() as u32;
    assert_eq!(k, 515); // (1546.28 - 148.41) / 2.718 = 514.25
    let mut want: BTreeSet<u32> = (0..k).map(|k| 2 * k).collect();
    want.insert(1999);
    let mut s = sampler(SamplingParams {
        temperature: 1.0,
        top_p: 0.4,
        ..params()
    });
    assert_eq!(cand_set(&mut s, &logits, &[]), want);
}

#[test]
fn min_p_drops_tokens_below_fraction_of_max() {
    let logits = ln_probs(&[0.5, 0.3, 0.15, 0.05]);
    for (m, want) in [
        (0.35f32, &[0u32, 1][..]), // threshold .175
        (0.61, &[0]),              // .3 / .5 = .6 is the ratio of token 1
        (0.59, &[0, 1]),
        (0.31, &[0, 1]), // .15 / .5 = .3 for token 2
        (0.29, &[0, 1, 2]),
        (0.25, &[0, 1, 2]),    // threshold .125
        (0.05, &[0, 1, 2, 3]), // threshold .025
        (0.0, &[0, 1, 2, 3]),  // off
    ] {
        let mut s = sampler(SamplingParams {
            temperature: 1.0,
            min_p: m,
            ..params()
        });
        assert_eq!(cand_set(&mut s, &logits, &[]), set(want), "min_p={m}");
    }
    let mut s = sampler(SamplingParams {
        temperature: 1.0,
        min_p: 0.35,
        ..params()
    });
    let got = frequencies(&mut s, &logits, N);
    assert_eq!(got[2] + got[3], 0.0);
    assert!((got[0] - 0.625).abs() < 0.015, "{got:?}");
}

// ------------------------------------------------------------ penalties

const PEN_LOGITS: [f32; 5] = [2.0, -1.0, 0.5, 3.0, 0.0];
// counts: token0 ×1, token1 ×2, token3 ×3, token4 ×1; token2 absent; 99 out of vocab.
const PEN_HISTORY: [u32; 8] = [0, 1, 4, 1, 3, 99, 3, 3];

fn processed(p: SamplingParams, logits: &[f32], history: &[u32]) -> Vec<f32> {
    sampler(p).processed_logits(logits, history).to_vec()
}

#[test]
fn repetition_penalty_divides_positive_multiplies_negative() {
    let got = processed(
        SamplingParams {
            repetition_penalty: 2.0,
            ..params()
        },
        &PEN_LOGITS,
        &PEN_HISTORY,
    );
    assert_close(&got, &[1.0, -2.0, 0.5, 1.5, 0.0], 1e-6);
    // penalty < 1 rewards repeats instead
    let got = processed(
        SamplingParams {
            repetition_penalty: 0.5,
            ..params()
        },
        &PEN_LOGITS,
        &PEN_HISTORY,
    );
    assert_close(&got, &[4.0, -0.5, 0.5, 6.0, 0.0], 1e-6);
}

#[test]
fn presence_and_frequency_penalties() {
    let got = processed(
        SamplingParams {
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            ..params()
        },
        &PEN_LOGITS,
        &PEN_HISTORY,
    );
    // l - count*0.25 - 0.5 for seen tokens
    assert_close(&got, &[1.25, -2.0, 0.5, 1.75, -0.75], 1e-6);
    let got = processed(
        SamplingParams {
            presence_penalty: 1.0,
            ..params()
        },
        &PEN_LOGITS,
        &PEN_HISTORY,
    );
    assert_close(&got, &[1.0, -2.0, 0.5, 2.0, -1.0], 1e-6);
    let got = processed(
        SamplingParams {
            frequency_penalty: 1.0,
            ..params()
        },
        &PEN_LOGITS,
        &PEN_HISTORY,
    );
    assert_close(&got, &[1.0, -3.0, 0.5, 0.0, -1.0], 1e-6);
}

#[test]
fn all_penalties_combined_repetition_first() {
    let got = processed(
        SamplingParams {
            repetition_penalty: 2.0,
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            ..params()
        },
        &PEN_LOGITS,
        &PEN_HISTORY,
    );
    // token0: 2/2 - .25 - .5; token1: -1*2 - .5 - .5; token3: 3/2 - .75 - .5; token4: 0 - .25 - .5
    assert_close(&got, &[0.25, -3.0, 0.5, 0.25, -0.75], 1e-6);
}

#[test]
fn penalty_window_is_respected() {
    let p = |n| SamplingParams {
        repetition_penalty: 2.0,
        presence_penalty: 0.5,
        frequency_penalty: 0.25,
        penalty_last_n: n,
        ..params()
    };
    // last 2 of PEN_HISTORY = [3, 3]: token3 only, count 2 → 1.5 - .5 - .5
    let got = processed(p(2), &PEN_LOGITS, &PEN_HISTORY);
    assert_close(&got, &[2.0, -1.0, 0.5, 0.5, 0.0], 1e-6);
    // last 4 = [3, 99, 3, 3]: token3 count 3
    let got = processed(p(4), &PEN_LOGITS, &PEN_HISTORY);
    assert_close(&got, &[2.0, -1.0, 0.5, 0.25, 0.0], 1e-6);
    // a window longer than the history, or 0, covers everything
    let all = [0.25, -3.0, 0.5, 0.25, -0.75];
    assert_close(&processed(p(100), &PEN_LOGITS, &PEN_HISTORY), &all, 1e-6);
    assert_close(&processed(p(0), &PEN_LOGITS, &PEN_HISTORY), &all, 1e-6);
}

#[test]
fn penalties_change_greedy_choice_and_do_not_leak_between_calls() {
    let mut s = sampler(SamplingParams {
        repetition_penalty: 1.5,
        ..params()
    });
    // 3.0 / 1.5 = 2.0 < 2.9
    assert_eq!(s.sample(&[3.0, 2.9], &[0]), 1);
    assert_eq!(s.sample(&[3.0, 2.9], &[]), 0);
    assert_eq!(s.sample(&[3.0, 2.9], &[1]), 0);
    // and a smaller vocabulary afterwards still works
    assert_eq!(s.sample(&[1.0], &[0, 5, 7]), 0);
    assert_eq!(s.sample(&[3.0, 2.9, 0.0], &[0, 0, 2]), 1);
}

// ------------------------------------------------------------ logit bias

#[test]
fn logit_bias_bans_and_forces() {
    let logits = [1.0, 3.0, 2.0, 0.0];
    for ban in [f32::NEG_INFINITY, -100.0] {
        let mut s = sampler(SamplingParams {
            logit_bias: vec![(1, ban)],
            ..params()
        });
        assert_eq!(s.sample(&logits, &[]), 2, "greedy, ban={ban}");
        let mut s = sampler(SamplingParams {
            temperature: 1.0,
            logit_bias: vec![(1, ban)],
            ..params()
        });
        for _ in 0..2000 {
            assert_ne!(s.sample(&logits, &[]), 1, "ban={ban}");
        }
    }
    let mut s = sampler(SamplingParams {
        temperature: 1.5,
        logit_bias: vec![(3, 100.0)],
        ..params()
    });
    for _ in 0..2000 {
        assert_eq!(s.sample(&logits, &[]), 3);
    }
    // bias is applied before penalties: (3 + 1) / 2 = 2 < 2.5
    let got = processed(
        SamplingParams {
            logit_bias: vec![(1, 1.0), (2, 0.5)],
            repetition_penalty: 2.0,
            ..params()
        },
        &logits,
        &[1],
    );
    assert_close(&got, &[1.0, 2.0, 2.5, 0.0], 1e-6);
}

#[test]
fn everything_banned_does_not_panic() {
    let mut s = sampler(SamplingParams {
        temperature: 1.0,
        logit_bias: vec![(0, -INF), (1, -INF)],
        ..params()
    });
    assert_eq!(s.sample(&[1.0, 2.0], &[]), 0);
}

// ------------------------------------------------------------ validation

#[test]
fn validate_accepts_good_params() {
    SamplingParams::default().validate(10).unwrap();
    SamplingParams {
        temperature: 0.8,
        top_k: 40,
        top_p: 0.95,
        min_p: 0.05,
        repetition_penalty: 1.1,
        presence_penalty: -0.5,
        frequency_penalty: 2.0,
        penalty_last_n: 64,
        seed: Some(1),
        logit_bias: vec![(9, -INF), (0, 100.0)],
    }
    .validate(10)
    .unwrap();
}

#[test]
fn validate_rejects_bad_values_naming_the_parameter() {
    let d = SamplingParams::default;
    let cases: Vec<(SamplingParams, &str)> = vec![
        (
            SamplingParams {
                temperature: -0.1,
                ..d()
            },
            "temperature",
        ),
        (
            SamplingParams {
                temperature: NAN,
                ..d()
            },
            "temperature",
        ),
        (
            SamplingParams {
                temperature: INF,
                ..d()
            },
            "temperature",
        ),
        (SamplingParams { top_p: 0.0, ..d() }, "top_p"),
        (SamplingParams { top_p: 1.5, ..d() }, "top_p"),
        (SamplingParams { top_p: NAN, ..d() }, "top_p"),
        (SamplingParams { min_p: -0.1, ..d() }, "min_p"),
        (SamplingParams { min_p: 1.1, ..d() }, "min_p"),
        (SamplingParams { min_p: NAN, ..d() }, "min_p"),
        (
            SamplingParams {
                repetition_penalty: 0.0,
                ..d()
            },
            "repetition_penalty",
        ),
        (
            SamplingParams {
                repetition_penalty: -1.0,
                ..d()
            },
            "repetition_penalty",
        ),
        (
            SamplingParams {
                repetition_penalty: NAN,
                ..d()
            },
            "repetition_penalty",
        ),
        (
            SamplingParams {
                presence_penalty: NAN,
                ..d()
            },
            "presence_penalty",
        ),
        (
            SamplingParams {
                frequency_penalty: INF,
                ..d()
            },
            "frequency_penalty",
        ),
        (
            SamplingParams {
                logit_bias: vec![(10, 1.0)],
                ..d()
            },
            "logit_bias",
        ),
        (
            SamplingParams {
                logit_bias: vec![(1, NAN)],
                ..d()
            },
            "logit_bias",
        ),
    ];
    for (p, name) in cases {
        let err = p.validate(10).expect_err(name);
        assert_eq!(err.param, name);
        let msg = err.to_string();
        assert!(msg.contains(name), "{msg}");
        let _: lone_core::Error = err.into();
    }
    let msg = SamplingParams {
        logit_bias: vec![(10, 1.0)],
        ..d()
    }
    .validate(10)
    .unwrap_err()
    .to_string();
    assert!(msg.contains("10") && msg.contains("vocab"), "{msg}");
}

#[test]
fn params_deserialize_with_defaults() {
    let p: SamplingParams = serde_json::from_str(r#"{"temperature": 0.7, "top_k": 40}"#).unwrap();
    assert_eq!(p.temperature, 0.7);
    assert_eq!(p.top_k, 40);
    assert_eq!(p.top_p, 1.0);
    assert_eq!(p.repetition_penalty, 1.0);
    assert_eq!(p.seed, None);
}

// ------------------------------------------------------ non-finite input

#[test]
fn nan_and_inf_logits_never_panic() {
    let configs = [
        SamplingParams::default(),
        SamplingParams {
            temperature: 1.0,
            ..params()
        },
        SamplingParams {
            temperature: 0.7,
            top_k: 2,
            top_p: 0.9,
            min_p: 0.05,
            repetition_penalty: 1.3,
            presence_penalty: 0.5,
            frequency_penalty: 0.5,
            logit_bias: vec![(0, 5.0), (3, -INF), (1000, 1.0)],
            ..params()
        },
        // invalid, unvalidated parameters must not panic either
        SamplingParams {
            temperature: NAN,
            top_p: 0.0,
            min_p: 2.0,
            repetition_penalty: 0.0,
            frequency_penalty: -INF,
            logit_bias: vec![(1, INF), (2, NAN)],
            ..params()
        },
        SamplingParams {
            temperature: 1e-30,
            top_p: NAN,
            min_p: NAN,
            repetition_penalty: -1.0,
            ..params()
        },
    ];
    let rows: [&[f32]; 7] = [
        &[NAN, 1.0, NAN, 0.5],
        &[NAN, NAN, NAN],
        &[-INF, -INF],
        &[1.0, INF, NAN, INF],
        &[f32::MAX, -f32::MAX, 0.0],
        &[],
        &[0.0],
    ];
    for p in configs {
        let mut s = sampler(p);
        for row in rows {
            for _ in 0..20 {
                let t = s.sample(row, &[0, 1, 2, 3, 3, 500]);
                assert!(row.is_empty() || (t as usize) < row.len());
            }
        }
    }
    // specific answers
    let mut s = sampler(SamplingParams {
        temperature: 1.0,
        ..params()
    });
    for _ in 0..200 {
        let t = s.sample(&[NAN, 1.0, NAN, 0.5], &[]);
        assert!(t == 1 || t == 3, "{t}");
    }
    assert_eq!(s.sample(&[NAN, NAN, NAN], &[]), 0);
    assert_eq!(s.sample(&[-INF, NAN, -INF], &[]), 0);
    assert_eq!(s.sample(&[1.0, INF, NAN, INF], &[]), 1);
    assert_eq!(s.sample(&[], &[]), 0);
    assert_eq!(sampler(params()).sample(&[NAN, 2.0], &[]), 1);
}

// -------------------------------------------------------------- logprobs

#[test]
fn log_softmax_and_top_logprobs() {
    let raw = [1.0f64, 3.0, 2.0, 3.0, -1.0];
    let lse = raw.iter().map(|x| x.exp()).sum::<f64>().ln();
    let want: Vec<f32> = raw.iter().map(|x| (x - lse) as f32).collect();
    let logits: Vec<f32> = raw.iter().map(|&x| x as f32).collect();
    assert!((logsumexp(&logits) - lse as f32).abs() < 1e-5);
    assert_close(&log_softmax(&logits), &want, 1e-5);
    assert!((token_logprob(&logits, 2) - want[2]).abs() < 1e-5);
    assert_eq!(token_logprob(&logits, 5), -INF);

    let top = top_logprobs(&logits, 3);
    let ids: Vec<u32> = top.iter().map(|e| e.0).collect();
    assert_eq!(ids, [1, 3, 2], "descending, ties by lower id");
    for (id, lp) in &top {
        assert!((lp - want[*id as usize]).abs() < 1e-5);
    }
    assert_eq!(top_logprobs(&logits, 10).len(), 5);
    assert!(top_logprobs(&logits, 0).is_empty());

    // large logits stay finite (stable)
    let big = [1000.0f32, 1000.0];
    assert_close(&log_softmax(&big), &[-(2f32.ln()), -(2f32.ln())], 1e-6);

    // Large vocab: agrees with a full sort.
    let logits = Lcg(11).logits(5000);
    let mut order: Vec<u32> = (0..5000).collect();
    order.sort_by(|&a, &b| {
        logits[b as usize]
            .total_cmp(&logits[a as usize])
            .then(a.cmp(&b))
    });
    let top = top_logprobs(&logits, 20);
    assert_eq!(top.iter().map(|e| e.0).collect::<Vec<_>>(), order[..20]);
    let total: f64 = log_softmax(&logits).iter().map(|&l| (l as f64).exp()).sum();
    assert!((total - 1.0).abs() < 1e-4, "{total}");
}

#[test]
fn logprobs_non_finite() {
    assert_close(
        &log_softmax(&[NAN, 0.0, -INF, 0.0]),
        &[-INF, -(2f32.ln()), -INF, -(2f32.ln())],
        1e-6,
    );
    assert_close(&log_softmax(&[-INF, NAN]), &[-INF, -INF], 0.0);
    assert_close(
        &log_softmax(&[INF, 1.0, INF]),
        &[-(2f32.ln()), -INF, -(2f32.ln())],
        1e-6,
    );
    let top = top_logprobs(&[NAN, 0.0, -INF], 3);
    assert_eq!(top[0], (1, 0.0));
    assert_eq!(top[1].1, -INF);
}
