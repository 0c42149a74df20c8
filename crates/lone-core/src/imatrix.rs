//! Importance matrices: per weight matrix, the mean square of each input column over
//! calibration text — llama.cpp's `llama-imatrix` statistics, in its files.
//!
//! - [`Imatrix::collect`] runs the model over the text as llama-imatrix does: chunks of `ctx`
//!   tokens, each from an empty cache (its first token replaced by BOS when the tokenizer adds
//!   one), every pass of at least 16 rows through a `blk.*` weight (and `output.weight` when
//!   asked) adding Σx² per column and the row count.
//! - Files: llama.cpp's GGUF imatrix (`general.type = imatrix`, `imatrix.datasets`,
//!   `imatrix.chunk_count`, `imatrix.chunk_size`, tensors `<weight>.in_sum2` and
//!   `<weight>.counts`) written and read; its legacy `.dat` format read.
//! - [`Imatrix::importance`] is what llama-quantize hands the quantizers: `in_sum2 / counts`
//!   (1 where nothing was counted).

use std::collections::BTreeMap;
use std::path::Path;

use crate::convert::{Plan, PlanTensor, RowOrder};
use crate::error::{Error, Result};
use crate::loader::gguf::{GgufFile, MetaValue};
use crate::models::{Batch, Model};
use crate::nn::activations;
use crate::tensor::{DType, Tensor};

/// One weight's statistics.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// Σx² per column, `ne0 × n_mat` (n_mat 1 for a dense matrix).
    pub sums: Vec<f32>,
    /// Rows seen per matrix (legacy files: the number of calls).
    pub counts: Vec<f32>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Imatrix {
    pub entries: BTreeMap<String, Entry>,
    pub datasets: Vec<String>,
    pub chunk_count: u32,
    pub chunk_size: u32,
    /// Read from a legacy `.dat` file (sums already averaged per call).
    pub legacy: bool,
}

fn bad(path: &Path, msg: impl Into<String>) -> Error {
    Error::BadFile {
        path: path.to_path_buf(),
        msg: msg.into(),
    }
}

/// How [`Imatrix::collect`] reads the text (llama-imatrix's options).
#[derive(Clone, Debug)]
pub struct CollectOptions {
    /// Tokens per chunk (`-c`).
    pub ctx: usize,
    /// At most this many chunks (`--chunks`).
    pub chunks: Option<usize>,
    /// The token each chunk starts with, when the tokenizer adds one.
    pub bos: Option<u32>,
    /// Also collect `output.weight` (`--process-output`).
    pub process_output: bool,
    /// The text's name, recorded in `imatrix.datasets`.
    pub dataset: String,
}

impl Imatrix {
    /// Statistics of `model` over `tokens`, chunk by chunk; `on_chunk(i)` after each.
    pub fn collect(
        model: &Model,
        tokens: &[u32],
        opts: &CollectOptions,
        mut on_chunk: impl FnMut(usize),
    ) -> Result<Imatrix> {
        let (ctx, bos, process_output) = (opts.ctx, opts.bos, opts.process_output);
        // Passes shorter than MIN_ROWS are not counted, so no chunk may be.
        crate::perplexity::check_chunks(model, tokens, ctx, activations::MIN_ROWS, "an imatrix")?;
        let n_chunks = (tokens.len() / ctx).min(opts.chunks.unwrap_or(usize::MAX));
        activations::start();
        let run = (|| -> Result<()> {
            for i in 0..n_chunks {
                let mut b = Batch::default();
                for (pos, &t) in tokens[i * ctx..(i + 1) * ctx].iter().enumerate() {
                    let tok = match (pos, bos) {
                        (0, Some(bos)) => bos,
                        _ => t,
                    };
                    b.push(0, pos, tok, process_output || pos + 1 == ctx);
                }
                let mut cache = model.new_cache();
                model.forward(&b, std::slice::from_mut(&mut cache))?;
                on_chunk(i);
            }
            Ok(())
        })();
        let stats = activations::stop();
        run?;
        let mut entries = BTreeMap::new();
        for (name, (sums, counts)) in stats {
            if !(name.starts_with("blk.") || (process_output && name == "output.weight")) {
                continue;
            }
            if let Some(j) = sums.iter().position(|v| !v.is_finite()) {
                return Err(Error::Msg(format!(
                    "non-finite activation statistics for {name} (column {j}): the model produced inf/NaN"
                )));
            }
            entries.insert(
                name,
                Entry {
                    sums,
                    counts: counts.iter().map(|&c| c as f32).collect(),
                },
            );
        }
        Ok(Imatrix {
            entries,
            datasets: vec![opts.dataset.clone()],
            chunk_count: n_chunks as u32,
            chunk_size: ctx as u32,
            legacy: false,
        })
    }

    /// llama.cpp's GGUF imatrix file.
    pub fn to_plan(&self) -> Plan {
        let mut plan = Plan::default();
        plan.set("general.type", MetaValue::String("imatrix".into()));
        plan.set(
            "imatrix.datasets",
            MetaValue::Array(
                self.datasets
                    .iter()
                    .map(|d| MetaValue::String(d.clone()))
                    .collect(),
            ),
        );
        plan.set("imatrix.chunk_count", MetaValue::U32(self.chunk_count));
        plan.set("imatrix.chunk_size", MetaValue::U32(self.chunk_size));
        for (name, e) in &self.entries {
            let nmat = e.counts.len().max(1);
            let f = |suffix: &str, shape: Vec<usize>, data: &[f32]| PlanTensor {
                name: format!("{name}.{suffix}"),
                source: Tensor::from_f32(shape.clone(), data).into(),
                shape,
                dtype: DType::F32,
                rows: RowOrder::Same,
                importance: None,
            };
            // ggml writes a 2-D `[ne0, n_mat]` tensor with its trailing 1s dropped.
            let (sums_shape, counts_shape) = if nmat == 1 {
                (vec![e.sums.len()], vec![1])
            } else {
                (vec![nmat, e.sums.len() / nmat], vec![nmat, 1])
            };
            plan.tensors.push(f("in_sum2", sums_shape, &e.sums));
            plan.tensors.push(f("counts", counts_shape, &e.counts));
        }
        plan
    }

    pub fn write(&self, path: &Path) -> Result<()> {
        self.to_plan().write(path, 1, &mut |_, _, _| {})?;
        Ok(())
    }

    /// Read a GGUF imatrix or a legacy `.dat` one.
    pub fn load(path: &Path) -> Result<Imatrix> {
        let head = {
            use std::io::Read;
            let mut f = crate::error::open_regular(path)?;
            let mut b = [0u8; 4];
            let n = f.read(&mut b).map_err(|e| Error::io(path, e))?;
            b[..n].to_vec()
        };
        if head == b"GGUF" {
            Self::load_gguf(path)
        } else {
            Self::load_legacy(path)
        }
    }

    fn load_gguf(path: &Path) -> Result<Imatrix> {
        let g = GgufFile::open(path)?;
        let mut im = Imatrix {
            chunk_count: g
                .meta("imatrix.chunk_count")
                .and_then(|v| v.as_u64())
                .unwrap_or(0) as u32,
            chunk_size: g
                .meta("imatrix.chunk_size")
                .and_then(|v| v.as_u64())
                .unwrap_or(0) as u32,
            datasets: g
                .meta("imatrix.datasets")
                .and_then(|v| v.as_array())
                .map(|a| {
                    a.iter()
                        .filter_map(|s| s.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default(),
            ..Default::default()
        };
        if g.meta("imatrix.chunk_size").is_none() || g.meta("imatrix.datasets").is_none() {
            return Err(bad(
                path,
                "not an imatrix file: no imatrix.datasets / imatrix.chunk_size metadata",
            ));
        }
        let mut sums: BTreeMap<String, Vec<f32>> = BTreeMap::new();
        let mut counts: BTreeMap<String, Vec<f32>> = BTreeMap::new();
        for t in &g.tensors {
            let data = g
                .tensor(&t.name)
                .map(|x| x.to_f32_vec())
                .unwrap_or_default();
            if t.dtype != DType::F32 {
                return Err(bad(path, format!("{} is {}, not F32", t.name, t.dtype)));
            }
            if let Some(n) = t.name.strip_suffix(".in_sum2") {
                sums.insert(n.to_string(), data);
            } else if let Some(n) = t.name.strip_suffix(".counts") {
                counts.insert(n.to_string(), data);
            }
        }
        for (name, s) in sums {
            let c = counts
                .remove(&name)
                .ok_or_else(|| bad(path, format!("{name} has in_sum2 but no counts")))?;
            if c.is_empty() || s.len() % c.len() != 0 {
                return Err(bad(
                    path,
                    format!(
                        "{name}: {} sums do not split into {} matrices",
                        s.len(),
                        c.len()
                    ),
                ));
            }
            im.entries.insert(name, Entry { sums: s, counts: c });
        }
        if im.entries.is_empty() {
            return Err(bad(path, "no imatrix entries"));
        }
        Ok(im)
    }

    fn load_legacy(path: &Path) -> Result<Imatrix> {
        let b = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        let mut pos = 0usize;
        let mut take = |n: usize| -> Result<&[u8]> {
            let s = b.get(pos..pos.saturating_add(n)).ok_or_else(|| {
                bad(
                    path,
                    "truncated imatrix file (neither GGUF nor legacy .dat)",
                )
            })?;
            pos += n;
            Ok(s)
        };
        let i32_at = |s: &[u8]| i32::from_le_bytes(s.try_into().unwrap());
        let n = i32_at(take(4)?);
        if !(1..=1 << 20).contains(&n) {
            return Err(bad(path, format!("not an imatrix file ({n} entries)")));
        }
        let mut im = Imatrix {
            legacy: true,
            ..Default::default()
        };
        for _ in 0..n {
            let len = i32_at(take(4)?);
            if !(1..=4096).contains(&len) {
                return Err(bad(path, format!("bad entry name length {len}")));
            }
            let name = String::from_utf8(take(len as usize)?.to_vec())
                .map_err(|_| bad(path, "entry name is not UTF-8"))?;
            let ncall = i32_at(take(4)?);
            let nval = i32_at(take(4)?);
            if !(1..=1 << 28).contains(&nval) {
                return Err(bad(path, format!("{name}: bad value count {nval}")));
            }
            let sums = take(4 * nval as usize)?
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            im.entries.insert(
                name,
                Entry {
                    sums,
                    counts: vec![ncall as f32],
                },
            );
        }
        if let Ok(c) = take(4) {
            im.chunk_count = i32_at(c).max(0) as u32;
            if let Ok(l) = take(4) {
                let l = i32_at(l);
                if l > 0 {
                    if let Ok(d) = take(l as usize) {
                        im.datasets.push(String::from_utf8_lossy(d).into_owned());
                    }
                }
            }
        }
        Ok(im)
    }

    /// llama-quantize's importances for weight `name`: `in_sum2 / counts` per matrix (1
    /// where a matrix saw no rows); legacy files: sums / calls.
    pub fn importance(&self, name: &str) -> Option<Vec<f32>> {
        let e = self.entries.get(name)?;
        let ncounts = e.counts.len().max(1);
        let ne0 = e.sums.len() / ncounts;
        let mut out = vec![0f32; e.sums.len()];
        if self.legacy {
            let ncall = e.counts.first().copied().unwrap_or(0.0);
            for (o, &s) in out.iter_mut().zip(&e.sums) {
                *o = if ncall > 0.0 { s / ncall } else { s };
            }
            return Some(out);
        }
        for j in 0..ncounts {
            let c = e.counts[j];
            for i in 0..ne0 {
                out[j * ne0 + i] = if c > 0.0 {
                    e.sums[j * ne0 + i] / c
                } else {
                    1.0
                };
            }
        }
        Some(out)
    }
}
