//! Model files out: a Hugging Face checkpoint or a GGUF file → a GGUF file of a chosen type.
//!
//! - [`hf`] turns a checkpoint into what llama.cpp's `convert_hf_to_gguf.py` writes (metadata,
//!   tensor names, order and types), [`vocab`] its tokenizer metadata, [`naming`] its
//!   `general.*` names.
//! - [`mix`] turns any plan into what `llama-quantize` writes for a file type (per-tensor
//!   types for the `_S`/`_M` mixes, tensor order, metadata updates).
//! - [`Plan::write`] streams the file: one tensor is converted at a time, from the
//!   memory-mapped source.
//!
//! A checkpoint at F32, F16, BF16 or Q8_0 is what the converter writes with that `--outtype`;
//! any other type is the converter's F32 file passed through llama-quantize.

pub mod card;
pub mod hf;
pub mod mix;
pub mod mmproj;
pub mod naming;
mod pre_table;
pub mod search;
pub mod split;
pub mod vocab;

use std::io::{BufWriter, Write};
use std::path::Path;

use crate::error::{Error, Result};
use crate::loader::gguf::{GgufFile, MetaValue};
use crate::quant;
use crate::tensor::{DType, Tensor};

/// GGUF's default data alignment (`general.alignment` absent).
pub const ALIGNMENT: usize = 32;

/// A whole-file quantization type: llama.cpp's `llama_ftype` (`general.file_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileType {
    F32,
    F16,
    BF16,
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q6K,
    Q5KM,
    Q5KS,
    Q4KM,
    Q4KS,
    Q3KL,
    Q3KM,
    Q3KS,
    Q2K,
    IQ4XS,
    IQ4NL,
    IQ3M,
    IQ3S,
    IQ3XS,
    IQ3XXS,
    IQ2M,
    IQ2S,
    IQ2XS,
    IQ2XXS,
    IQ1M,
    IQ1S,
    TQ2_0,
    TQ1_0,
}

impl FileType {
    pub const ALL: [FileType; 31] = [
        FileType::F32,
        FileType::F16,
        FileType::BF16,
        FileType::Q8_0,
        FileType::Q6K,
        FileType::Q5KM,
        FileType::Q5KS,
        FileType::Q5_1,
        FileType::Q5_0,
        FileType::Q4KM,
        FileType::Q4KS,
        FileType::Q4_1,
        FileType::Q4_0,
        FileType::Q3KL,
        FileType::Q3KM,
        FileType::Q3KS,
        FileType::Q2K,
        FileType::IQ4XS,
        FileType::IQ4NL,
        FileType::IQ3M,
        FileType::IQ3S,
        FileType::IQ3XS,
        FileType::IQ3XXS,
        FileType::IQ2M,
        FileType::IQ2S,
        FileType::IQ2XS,
        FileType::IQ2XXS,
        FileType::IQ1M,
        FileType::IQ1S,
        FileType::TQ2_0,
        FileType::TQ1_0,
    ];

    /// The name llama-quantize prints and accepts (`Q4_K_M`).
    pub fn name(self) -> &'static str {
        match self {
            FileType::F32 => "F32",
            FileType::F16 => "F16",
            FileType::BF16 => "BF16",
            FileType::Q8_0 => "Q8_0",
            FileType::Q4_0 => "Q4_0",
            FileType::Q4_1 => "Q4_1",
            FileType::Q5_0 => "Q5_0",
            FileType::Q5_1 => "Q5_1",
            FileType::Q6K => "Q6_K",
            FileType::Q5KM => "Q5_K_M",
            FileType::Q5KS => "Q5_K_S",
            FileType::Q4KM => "Q4_K_M",
            FileType::Q4KS => "Q4_K_S",
            FileType::Q3KL => "Q3_K_L",
            FileType::Q3KM => "Q3_K_M",
            FileType::Q3KS => "Q3_K_S",
            FileType::Q2K => "Q2_K",
            FileType::IQ4XS => "IQ4_XS",
            FileType::IQ4NL => "IQ4_NL",
            FileType::IQ3M => "IQ3_M",
            FileType::IQ3S => "IQ3_S",
            FileType::IQ3XS => "IQ3_XS",
            FileType::IQ3XXS => "IQ3_XXS",
            FileType::IQ2M => "IQ2_M",
            FileType::IQ2S => "IQ2_S",
            FileType::IQ2XS => "IQ2_XS",
            FileType::IQ2XXS => "IQ2_XXS",
            FileType::IQ1M => "IQ1_M",
            FileType::IQ1S => "IQ1_S",
            FileType::TQ2_0 => "TQ2_0",
            FileType::TQ1_0 => "TQ1_0",
        }
    }

    /// Parse a type name, case-insensitively; `Q4_K` and `Q5_K` mean their `_M` mixes and
    /// `Q3_K` its `_M`, as llama-quantize's names do.
    pub fn parse(s: &str) -> Option<FileType> {
        let u = s.trim().to_ascii_uppercase();
        let alias = match u.as_str() {
            "Q4_K" => "Q4_K_M",
            "Q5_K" => "Q5_K_M",
            "Q3_K" => "Q3_K_M",
            other => other,
        };
        FileType::ALL.into_iter().find(|t| t.name() == alias)
    }

    /// `general.file_type`.
    pub fn id(self) -> u32 {
        match self {
            FileType::F32 => 0,
            FileType::F16 => 1,
            FileType::Q4_0 => 2,
            FileType::Q4_1 => 3,
            FileType::Q8_0 => 7,
            FileType::Q5_0 => 8,
            FileType::Q5_1 => 9,
            FileType::Q2K => 10,
            FileType::Q3KS => 11,
            FileType::Q3KM => 12,
            FileType::Q3KL => 13,
            FileType::Q4KS => 14,
            FileType::Q4KM => 15,
            FileType::Q5KS => 16,
            FileType::Q5KM => 17,
            FileType::Q6K => 18,
            FileType::BF16 => 32,
            FileType::IQ2XXS => 19,
            FileType::IQ2XS => 20,
            FileType::IQ3XS => 22,
            FileType::IQ3XXS => 23,
            FileType::IQ1S => 24,
            FileType::IQ4NL => 25,
            FileType::IQ3S => 26,
            FileType::IQ3M => 27,
            FileType::IQ2S => 28,
            FileType::IQ2M => 29,
            FileType::IQ4XS => 30,
            FileType::IQ1M => 31,
            FileType::TQ1_0 => 36,
            FileType::TQ2_0 => 37,
        }
    }

    /// The tensor type most weight matrices get (`llama_ftype_get_default_type`).
    pub fn default_dtype(self) -> DType {
        match self {
            FileType::F32 => DType::F32,
            FileType::F16 => DType::F16,
            FileType::BF16 => DType::BF16,
            FileType::Q8_0 => DType::Q8_0,
            FileType::Q4_0 => DType::Q4_0,
            FileType::Q4_1 => DType::Q4_1,
            FileType::Q5_0 => DType::Q5_0,
            FileType::Q5_1 => DType::Q5_1,
            FileType::Q6K => DType::Q6K,
            FileType::Q5KM | FileType::Q5KS => DType::Q5K,
            FileType::Q4KM | FileType::Q4KS => DType::Q4K,
            FileType::Q3KL | FileType::Q3KM | FileType::Q3KS => DType::Q3K,
            FileType::Q2K => DType::Q2K,
            FileType::IQ4XS => DType::IQ4XS,
            FileType::IQ4NL => DType::IQ4NL,
            FileType::IQ3M | FileType::IQ3S | FileType::IQ3XS => DType::IQ3S,
            FileType::IQ3XXS => DType::IQ3XXS,
            FileType::IQ2M => DType::IQ2S,
            FileType::IQ2S | FileType::IQ2XS => DType::IQ2XS,
            FileType::IQ2XXS => DType::IQ2XXS,
            FileType::IQ1M => DType::IQ1M,
            FileType::IQ1S => DType::IQ1S,
            FileType::TQ2_0 => DType::TQ2_0,
            FileType::TQ1_0 => DType::TQ1_0,
        }
    }

    /// The types `convert_hf_to_gguf.py --outtype` writes itself (the others go through
    /// llama-quantize).
    pub fn is_converter_type(self) -> bool {
        matches!(
            self,
            FileType::F32 | FileType::F16 | FileType::BF16 | FileType::Q8_0
        )
    }

    /// Every accepted name, for messages.
    pub fn names() -> String {
        FileType::ALL.map(|t| t.name()).join(", ")
    }
}

/// How a tensor's rows are rearranged on the way out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowOrder {
    Same,
    /// llama's Q/K permutation for GGUF's interleaved RoPE, with this many heads: output row
    /// `h*hd + 2i + j` is input row `h*hd + j*hd/2 + i`.
    InterleaveHeads(usize),
}

/// For llama's Q/K permutation of `rows` rows in `heads` heads: the input row that output
/// row `r` takes (`h*hd + 2i + j` ← `h*hd + j*hd/2 + i`). The caller checked the split.
pub(crate) fn interleaved_source(r: usize, rows: usize, heads: usize) -> usize {
    let hd = rows / heads;
    let (head, within) = (r / hd, r % hd);
    head * hd + (within % 2) * (hd / 2) + within / 2
}

/// Where an output tensor's values come from: one stored tensor, or several whose rows follow
/// one another (a layer's experts, one tensor each in a checkpoint, stacked into a GGUF's
/// `ffn_*_exps`).
#[derive(Clone, Debug)]
pub struct Source {
    parts: Vec<Tensor>,
}

impl From<Tensor> for Source {
    fn from(t: Tensor) -> Source {
        Source { parts: vec![t] }
    }
}

impl Source {
    /// The rows of `parts` one after another; `None` unless they are rows of one length.
    pub fn stacked(parts: Vec<Tensor>) -> Option<Source> {
        let first = parts.first()?;
        let n = first.row_len();
        parts
            .iter()
            .all(|p| p.row_len() == n)
            .then_some(Source { parts })
    }

    /// The one tensor, when not stacked.
    pub fn single(&self) -> Option<&Tensor> {
        match self.parts.as_slice() {
            [t] => Some(t),
            _ => None,
        }
    }

    pub fn numel(&self) -> usize {
        self.parts.iter().map(Tensor::numel).sum()
    }

    pub fn row_len(&self) -> usize {
        self.parts.first().map_or(1, Tensor::row_len)
    }

    /// Every part's stored type, when they share one.
    pub fn dtype(&self) -> Option<DType> {
        let d = self.parts.first()?.dtype;
        self.parts.iter().all(|p| p.dtype == d).then_some(d)
    }

    /// Row `r` of the rows of all parts, as f32.
    pub fn row_to_f32(&self, mut r: usize, out: &mut [f32]) {
        for p in &self.parts {
            let n = p.n_rows();
            if r < n {
                return p.row_to_f32(r, out);
            }
            r -= n;
        }
        panic!("row past the stacked source (checked by check_tensor)");
    }

    /// The stored bytes of all parts, one after another.
    fn data(&self) -> Vec<u8> {
        self.parts.iter().flat_map(|p| p.data()).copied().collect()
    }
}

/// One tensor of the output file: where its values come from and how it is stored.
#[derive(Clone, Debug)]
pub struct PlanTensor {
    pub name: String,
    /// Row-major shape (outermost first), as lone's loader reports it.
    pub shape: Vec<usize>,
    pub dtype: DType,
    pub source: Source,
    pub rows: RowOrder,
    /// Per-column importances (an imatrix row) for the quantizer, if any; for a stack of
    /// experts one row per expert, expert by expert.
    pub importance: Option<std::sync::Arc<Vec<f32>>>,
}

impl PlanTensor {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn row_len(&self) -> usize {
        self.shape.last().copied().unwrap_or(1)
    }
    pub fn n_bytes(&self) -> usize {
        self.dtype.bytes_for(self.numel()).unwrap_or(0)
    }
}

/// A GGUF file to write: metadata in order, then tensors in order.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    pub kv: Vec<(String, MetaValue)>,
    pub tensors: Vec<PlanTensor>,
}

impl Plan {
    /// Set a key: in place when present (gguf-py's overwrite), else appended.
    pub fn set(&mut self, key: &str, value: MetaValue) {
        match self.kv.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value,
            None => self.kv.push((key.to_string(), value)),
        }
    }

    /// Remove a key, then append it (ggml's `gguf_set_val_*`).
    pub fn set_last(&mut self, key: &str, value: MetaValue) {
        self.remove(key);
        self.kv.push((key.to_string(), value));
    }

    pub fn remove(&mut self, key: &str) {
        self.kv.retain(|(k, _)| k != key);
    }

    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.kv.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// A plan that copies a GGUF file as it is (the start of a requantization).
    pub fn from_gguf(g: &GgufFile) -> Result<Plan> {
        let mut plan = Plan::default();
        for k in &g.kv_order {
            if let Some(v) = g.metadata.get(k) {
                plan.kv.push((k.clone(), v.clone()));
            }
        }
        for info in &g.tensors {
            let source = g
                .tensor(&info.name)
                .ok_or_else(|| Error::Config(format!("tensor '{}' vanished", info.name)))?;
            plan.tensors.push(PlanTensor {
                name: info.name.clone(),
                shape: info.shape.clone(),
                dtype: info.dtype,
                source: source.into(),
                rows: RowOrder::Same,
                importance: None,
            });
        }
        Ok(plan)
    }

    /// Total bytes of tensor data (without padding).
    pub fn tensor_bytes(&self) -> usize {
        self.tensors.iter().map(|t| t.n_bytes()).sum()
    }

    /// The header: magic, counts, metadata, tensor infos, padded to the alignment.
    fn header(&self) -> Result<Vec<u8>> {
        let mut h = Vec::new();
        h.extend_from_slice(b"GGUF");
        h.extend_from_slice(&3u32.to_le_bytes());
        h.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        h.extend_from_slice(&(self.kv.len() as u64).to_le_bytes());
        for (k, v) in &self.kv {
            put_str(&mut h, k);
            h.extend_from_slice(&value_type(v).to_le_bytes());
            put_value(&mut h, v)?;
        }
        let mut offset = 0usize;
        for t in &self.tensors {
            put_str(&mut h, &t.name);
            h.extend_from_slice(&(t.shape.len() as u32).to_le_bytes());
            for &d in t.shape.iter().rev() {
                h.extend_from_slice(&(d as u64).to_le_bytes());
            }
            h.extend_from_slice(&t.dtype.ggml_type().to_le_bytes());
            h.extend_from_slice(&(offset as u64).to_le_bytes());
            offset += t.n_bytes().div_ceil(ALIGNMENT) * ALIGNMENT;
        }
        h.resize(h.len().div_ceil(ALIGNMENT) * ALIGNMENT, 0);
        Ok(h)
    }

    /// Write the file, converting one tensor at a time on `threads` threads. `progress` is
    /// called after each tensor with (index, tensor, bytes written so far).
    pub fn write(
        &self,
        path: &Path,
        threads: usize,
        progress: &mut dyn FnMut(usize, &PlanTensor, u64),
    ) -> Result<u64> {
        for t in &self.tensors {
            check_tensor(t)?;
        }
        let file = std::fs::File::create(path).map_err(|e| Error::io(path, e))?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        let header = self.header()?;
        out.write_all(&header).map_err(|e| Error::io(path, e))?;
        let mut written = header.len() as u64;
        for (i, t) in self.tensors.iter().enumerate() {
            let data = encode(t, threads)?;
            let pad = data.len().div_ceil(ALIGNMENT) * ALIGNMENT - data.len();
            out.write_all(&data).map_err(|e| Error::io(path, e))?;
            out.write_all(&[0u8; ALIGNMENT][..pad])
                .map_err(|e| Error::io(path, e))?;
            written += (data.len() + pad) as u64;
            progress(i, t, written);
        }
        out.flush().map_err(|e| Error::io(path, e))?;
        Ok(written)
    }
}

fn check_tensor(t: &PlanTensor) -> Result<()> {
    if t.numel() != t.source.numel() {
        return Err(Error::Config(format!(
            "tensor '{}': shape {:?} does not hold the source's {} values",
            t.name,
            t.shape,
            t.source.numel()
        )));
    }
    if !t.row_len().is_multiple_of(t.dtype.block_size()) || t.source.row_len() != t.row_len() {
        return Err(Error::Config(format!(
            "tensor '{}': rows of {} values cannot be stored as {} (blocks of {})",
            t.name,
            t.row_len(),
            t.dtype,
            t.dtype.block_size()
        )));
    }
    if let RowOrder::InterleaveHeads(h) = t.rows {
        let rows = t.numel() / t.row_len();
        if h == 0 || !rows.is_multiple_of(h) || !(rows / h).is_multiple_of(2) {
            return Err(Error::Config(format!(
                "tensor '{}': {rows} rows cannot be split into {h} heads of even size",
                t.name
            )));
        }
    }
    Ok(())
}

/// The stored bytes of one output tensor.
fn encode(t: &PlanTensor, threads: usize) -> Result<Vec<u8>> {
    let src = &t.source;
    if src.dtype() == Some(t.dtype) && t.rows == RowOrder::Same {
        return Ok(src.data());
    }
    let n = t.row_len();
    let rows = t.numel() / n.max(1);
    let out_rb = t.dtype.bytes_for(n).unwrap_or(0);
    let mut out = vec![0u8; rows * out_rb];
    let source_row = |r: usize| -> usize {
        match t.rows {
            RowOrder::Same => r,
            RowOrder::InterleaveHeads(h) => interleaved_source(r, rows, h),
        }
    };
    let dtype = t.dtype;
    let threads = threads.clamp(1, 64).min(rows.max(1));
    let per = rows.div_ceil(threads).max(1);
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let handles: Vec<_> = out
            .chunks_mut(per * out_rb.max(1))
            .enumerate()
            .map(|(c, chunk)| {
                s.spawn(move || -> Result<()> {
                    let mut row = vec![0f32; n];
                    for (k, dst) in chunk.chunks_mut(out_rb.max(1)).enumerate() {
                        let r = c * per + k;
                        src.row_to_f32(source_row(r), &mut row);
                        match &t.importance {
                            Some(qw) => {
                                // Row r's matrix (its expert) has its own importances.
                                let n_mat = (qw.len() / n.max(1)).max(1);
                                let m = r / (rows / n_mat).max(1);
                                let qw = qw.get(m * n..(m + 1) * n).unwrap_or(qw);
                                quant::quantize_row_weighted(dtype, &row, qw, dst)
                            }
                            None => quant::quantize_row(dtype, &row, dst),
                        }
                        .map_err(|e| {
                            Error::Config(format!("tensor '{}' as {dtype}: {e}", t.name))
                        })?;
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::Config("quantizer panicked".into())))
            })
            .collect()
    });
    for r in results {
        r?;
    }
    Ok(out)
}

fn put_str(h: &mut Vec<u8>, s: &str) {
    h.extend_from_slice(&(s.len() as u64).to_le_bytes());
    h.extend_from_slice(s.as_bytes());
}

/// GGUF's value type tag.
fn value_type(v: &MetaValue) -> u32 {
    match v {
        MetaValue::U8(_) => 0,
        MetaValue::I8(_) => 1,
        MetaValue::U16(_) => 2,
        MetaValue::I16(_) => 3,
        MetaValue::U32(_) => 4,
        MetaValue::I32(_) => 5,
        MetaValue::F32(_) => 6,
        MetaValue::Bool(_) => 7,
        MetaValue::String(_) => 8,
        MetaValue::Array(_) => 9,
        MetaValue::U64(_) => 10,
        MetaValue::I64(_) => 11,
        MetaValue::F64(_) => 12,
    }
}

fn put_value(h: &mut Vec<u8>, v: &MetaValue) -> Result<()> {
    match v {
        MetaValue::U8(x) => h.push(*x),
        MetaValue::I8(x) => h.push(*x as u8),
        MetaValue::U16(x) => h.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I16(x) => h.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U32(x) => h.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I32(x) => h.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F32(x) => h.extend_from_slice(&x.to_le_bytes()),
        MetaValue::Bool(x) => h.push(*x as u8),
        MetaValue::String(s) => put_str(h, s),
        MetaValue::U64(x) => h.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I64(x) => h.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F64(x) => h.extend_from_slice(&x.to_le_bytes()),
        MetaValue::Array(items) => {
            // An empty array keeps no element type; INT32 is as good as any.
            let ety = items.first().map(value_type).unwrap_or(5);
            if items.iter().any(|i| value_type(i) != ety) {
                return Err(Error::Config(
                    "a GGUF metadata array must hold values of one type".into(),
                ));
            }
            h.extend_from_slice(&ety.to_le_bytes());
            h.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for i in items {
                put_value(h, i)?;
            }
        }
    }
    Ok(())
}

/// Convert `input` (a checkpoint directory or a GGUF file) to `ftype`, with importances from
/// `imatrix` (and the name it was given, recorded in the file as llama-quantize does).
pub fn plan(
    input: &Path,
    ftype: FileType,
    opts: &hf::Options,
    imatrix: Option<(&crate::imatrix::Imatrix, &str)>,
) -> Result<Plan> {
    if input.is_dir() {
        if ftype.is_converter_type() && imatrix.is_none() {
            hf::plan(input, ftype, opts)
        } else {
            let base = hf::plan(input, FileType::F32, opts)?;
            mix::requantize(base, ftype, imatrix)
        }
    } else {
        let g = GgufFile::open(input)?;
        mix::requantize(Plan::from_gguf(&g)?, ftype, imatrix)
    }
}
