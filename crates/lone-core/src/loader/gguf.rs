//! GGUF (llama.cpp's model file format, v2/v3): metadata and memory-mapped tensors.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;

use crate::error::{Error, Result};
use crate::tensor::{ggml_type_name, DType, Tensor};

const GGUF_MAGIC: &[u8; 4] = b"GGUF";

/// llama.cpp's split keys (`llama-gguf-split`).
pub const SPLIT_NO: &str = "split.no";
pub const SPLIT_COUNT: &str = "split.count";
pub const SPLIT_TENSORS: &str = "split.tensors.count";

/// Part `i` (0-based) of an `n`-part split named from `prefix`: `PREFIX-0000{i+1}-of-0000N.gguf`
/// (llama.cpp's `llama_split_path`).
pub fn split_path(prefix: &str, i: usize, n: usize) -> PathBuf {
    PathBuf::from(format!("{prefix}-{:05}-of-{n:05}.gguf", i + 1))
}

/// The prefix of part `i` of `n` if `path` is named as [`split_path`] names it (llama.cpp's
/// `llama_split_prefix`).
pub fn split_prefix(path: &Path, i: usize, n: usize) -> Option<String> {
    let s = path.to_str()?;
    let post = format!("-{:05}-of-{n:05}.gguf", i + 1);
    (s.len() > post.len() && s.ends_with(&post)).then(|| s[..s.len() - post.len()].to_string())
}

/// The parts of a split named as [`split_path`] names them when `path` is a first part
/// (`…-00001-of-0000N.gguf`, N > 1), by name alone; `None` for any other name.
pub fn split_parts_by_name(path: &Path) -> Option<Vec<PathBuf>> {
    let n_text = path.to_str()?.strip_suffix(".gguf")?.rsplit_once("-of-")?.1;
    if n_text.len() != 5 || !n_text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: usize = n_text.parse().ok()?;
    let prefix = split_prefix(path, 0, n)?;
    (n > 1).then(|| (0..n).map(|i| split_path(&prefix, i, n)).collect())
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<MetaValue>),
}

impl MetaValue {
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }
    /// Any non-negative integer value.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v as u64),
            MetaValue::U16(v) => Some(v as u64),
            MetaValue::U32(v) => Some(v as u64),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            MetaValue::Bool(v) => Some(v as u64),
            _ => None,
        }
    }
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            MetaValue::I8(v) => Some(v as i64),
            MetaValue::I16(v) => Some(v as i64),
            MetaValue::I32(v) => Some(v as i64),
            MetaValue::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v as f64),
            MetaValue::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(v) => Some(v),
            _ => None,
        }
    }
    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// Where one tensor lies in the file.
#[derive(Clone, Debug)]
pub struct GgufTensorInfo {
    pub name: String,
    /// Row-major shape (outermost first); GGUF stores it innermost first.
    pub shape: Vec<usize>,
    pub dtype: DType,
    /// Which part of a split file holds it (0 for an unsplit file).
    pub file: usize,
    /// Absolute byte offset in that part.
    pub offset: usize,
    pub len: usize,
}

/// An opened GGUF file: metadata plus tensors that borrow the memory map. A file split by
/// `llama-gguf-split` (`NAME-00001-of-0000N.gguf` …) opens from its first part as one file:
/// the metadata is the first part's, the tensors those of every part.
pub struct GgufFile {
    pub path: PathBuf,
    pub version: u32,
    pub metadata: BTreeMap<String, MetaValue>,
    /// The metadata keys in the order the file lists them (what a rewriter keeps).
    pub kv_order: Vec<String>,
    pub tensors: Vec<GgufTensorInfo>,
    /// Every part's path (one for an unsplit file).
    pub parts: Vec<PathBuf>,
    /// Each part's memory map.
    maps: Vec<Arc<Mmap>>,
    /// `map` is the file mapped shared (not a copy in memory).
    file_backed: bool,
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Reader<'a> {
    fn err(&self, what: &str) -> Error {
        Error::BadFile {
            path: self.path.to_path_buf(),
            msg: format!(
                "{what} (at byte {}, file is {} bytes)",
                self.pos,
                self.buf.len()
            ),
        }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| self.err("unexpected end of file: truncated GGUF header"))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().unwrap()))
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn len(&mut self) -> Result<usize> {
        let n = self.u64()?;
        // Every element takes at least one byte, so a count beyond the file size is corrupt.
        if n > self.buf.len() as u64 {
            return Err(self.err(&format!("corrupt length {n}")));
        }
        Ok(n as usize)
    }
    fn string(&mut self) -> Result<String> {
        let n = self.len()?;
        let b = self.take(n)?;
        String::from_utf8(b.to_vec()).map_err(|_| self.err("string is not valid UTF-8"))
    }
    fn value(&mut self, ty: u32, depth: usize) -> Result<MetaValue> {
        Ok(match ty {
            0 => MetaValue::U8(self.u8()?),
            1 => MetaValue::I8(self.u8()? as i8),
            2 => MetaValue::U16(self.u16()?),
            3 => MetaValue::I16(self.u16()? as i16),
            4 => MetaValue::U32(self.u32()?),
            5 => MetaValue::I32(self.u32()? as i32),
            6 => MetaValue::F32(f32::from_bits(self.u32()?)),
            7 => MetaValue::Bool(self.u8()? != 0),
            8 => MetaValue::String(self.string()?),
            9 => {
                if depth > 2 {
                    return Err(self.err("metadata arrays nested too deeply"));
                }
                let ety = self.u32()?;
                let n = self.len()?;
                let mut v = Vec::with_capacity(n.min(1 << 20));
                for _ in 0..n {
                    v.push(self.value(ety, depth + 1)?);
                }
                MetaValue::Array(v)
            }
            10 => MetaValue::U64(self.u64()?),
            11 => MetaValue::I64(self.u64()? as i64),
            12 => MetaValue::F64(f64::from_bits(self.u64()?)),
            t => return Err(self.err(&format!("unknown metadata value type {t}"))),
        })
    }
}

impl GgufFile {
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let path = path.as_ref();
        let mut g = Self::open_part(path)?;
        let n = g.split_count();
        if n > 1 {
            g.open_other_parts(n)?;
        }
        Ok(g)
    }

    fn open_part(path: &Path) -> Result<GgufFile> {
        let file = crate::error::open_regular(path)?;
        // SAFETY: the file is mapped read-only; lone never writes to model files while they are
        // loaded. A concurrent writer could change what we read, as with any mmap-based loader.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        let mut g = Self::parse(path, Arc::new(map))?;
        g.file_backed = true;
        Ok(g)
    }

    /// `split.count` (llama.cpp's u16; 0 and 1 mean not split).
    fn split_count(&self) -> usize {
        self.meta(SPLIT_COUNT)
            .and_then(|v| v.as_u64())
            .map_or(1, |n| n as usize)
    }

    fn bad(&self, msg: String) -> Error {
        Error::BadFile {
            path: self.path.clone(),
            msg,
        }
    }

    /// The parts after this first one of an `n`-part split, as llama.cpp's loader finds them.
    fn open_other_parts(&mut self, n: usize) -> Result<()> {
        if n > u16::MAX as usize {
            return Err(self.bad(format!("{SPLIT_COUNT} = {n} is more than a split can have")));
        }
        let no = self.meta(SPLIT_NO).and_then(|v| v.as_u64());
        match no {
            Some(0) => {}
            Some(i) => {
                return Err(self.bad(format!(
                    "this is part {} of {n} of a split GGUF: open the first part ({})",
                    i + 1,
                    split_prefix(&self.path, i as usize, n)
                        .map(|p| split_path(&p, 0, n).display().to_string())
                        .unwrap_or_else(|| format!("…-00001-of-{n:05}.gguf"))
                )))
            }
            None => {
                return Err(self.bad(format!(
                    "{SPLIT_COUNT} = {n} but {SPLIT_NO} is missing: not a valid split GGUF"
                )))
            }
        }
        let prefix = split_prefix(&self.path, 0, n).ok_or_else(|| {
            self.bad(format!(
                "the first part of a {n}-part split GGUF must be named PREFIX-00001-of-{n:05}.gguf \
                 (llama.cpp's rule), so its other parts can be found"
            ))
        })?;
        for i in 1..n {
            let p = split_path(&prefix, i, n);
            if !p.exists() {
                return Err(self.bad(format!(
                    "part {} of {n} of this split GGUF is missing: {}",
                    i + 1,
                    p.display()
                )));
            }
            let part = Self::open_part(&p)?;
            let got = part.meta(SPLIT_NO).and_then(|v| v.as_u64());
            if got != Some(i as u64) {
                return Err(Error::BadFile {
                    path: p,
                    msg: format!(
                        "expected part {} of {n} ({SPLIT_NO} = {i}), found {SPLIT_NO} = {}",
                        i + 1,
                        got.map_or("none".into(), |g| g.to_string())
                    ),
                });
            }
            let file = self.maps.len();
            for mut t in part.tensors {
                if self.tensors.iter().any(|u| u.name == t.name) {
                    return Err(Error::BadFile {
                        path: p,
                        msg: format!("tensor '{}' is also in an earlier part", t.name),
                    });
                }
                t.file = file;
                self.tensors.push(t);
            }
            self.maps.extend(part.maps);
            self.parts.push(p);
        }
        let expected = self.meta(SPLIT_TENSORS).and_then(|v| v.as_u64());
        if expected != Some(self.tensors.len() as u64) {
            return Err(self.bad(format!(
                "the split GGUF's {SPLIT_TENSORS} is {} but its {n} parts hold {} tensors",
                expected.map_or("missing".into(), |e| e.to_string()),
                self.tensors.len()
            )));
        }
        Ok(())
    }

    /// A GGUF file held in memory (`label` names it in errors): what the fuzz targets read.
    pub fn from_bytes(label: &Path, bytes: &[u8]) -> Result<GgufFile> {
        Self::parse(label, Arc::new(super::anon_map(label, bytes)?))
    }

    fn parse(path: &Path, map: Arc<Mmap>) -> Result<GgufFile> {
        let buf: &[u8] = &map;
        let mut r = Reader { buf, pos: 0, path };
        if buf.len() < 4 || &buf[..4] != GGUF_MAGIC {
            return Err(Error::BadFile {
                path: path.to_path_buf(),
                msg: "not a GGUF file (missing GGUF magic)".into(),
            });
        }
        r.pos = 4;
        let version = r.u32()?;
        if !(2..=3).contains(&version) {
            return Err(r.err(&format!(
                "unsupported GGUF version {version} (lone reads v2 and v3)"
            )));
        }
        let n_tensors = r.len()?;
        let n_kv = r.len()?;
        let mut metadata = BTreeMap::new();
        let mut kv_order = Vec::with_capacity(n_kv.min(1 << 12));
        for _ in 0..n_kv {
            let key = r.string()?;
            let ty = r.u32()?;
            let v = r.value(ty, 0)?;
            if metadata.insert(key.clone(), v).is_none() {
                kv_order.push(key);
            }
        }
        let alignment = metadata
            .get("general.alignment")
            .and_then(|v| v.as_u64())
            .unwrap_or(32) as usize;
        if alignment == 0 || !alignment.is_power_of_two() {
            return Err(r.err(&format!("bad general.alignment {alignment}")));
        }
        let mut raw = Vec::with_capacity(n_tensors.min(1 << 16));
        for _ in 0..n_tensors {
            let name = r.string()?;
            let n_dims = r.u32()? as usize;
            if n_dims > 4 {
                return Err(r.err(&format!("tensor '{name}' has {n_dims} dimensions (max 4)")));
            }
            let mut dims = Vec::with_capacity(n_dims);
            for _ in 0..n_dims {
                dims.push(r.u64()? as usize);
            }
            let ty = r.u32()?;
            let off = r.u64()? as usize;
            raw.push((name, dims, ty, off));
        }
        let data_start = r.pos.div_ceil(alignment) * alignment;
        let mut tensors = Vec::with_capacity(raw.len());
        for (name, dims, ty, off) in raw {
            let dtype = DType::from_ggml_type(ty).ok_or_else(|| Error::BadFile {
                path: path.to_path_buf(),
                msg: format!(
                    "tensor '{name}' uses quantization type {} which lone does not support (supported: {})",
                    ggml_type_name(ty),
                    DType::ALL.map(|d| d.name()).join(", ")
                ),
            })?;
            let n: usize = dims
                .iter()
                .try_fold(1usize, |a, &d| a.checked_mul(d))
                .ok_or_else(|| r.err(&format!("tensor '{name}' has an overflowing shape")))?;
            if dims.first().is_some_and(|&d0| d0 % dtype.block_size() != 0) {
                return Err(r.err(&format!(
                    "tensor '{name}': row length {} is not a multiple of the {dtype} block size",
                    dims[0]
                )));
            }
            let len = dtype.bytes_for(n).ok_or_else(|| r.err("bad tensor size"))?;
            if off % alignment != 0 {
                return Err(r.err(&format!(
                    "tensor '{name}' starts at data offset {off}, which is not aligned to {alignment} bytes"
                )));
            }
            let offset = data_start
                .checked_add(off)
                .ok_or_else(|| r.err("bad tensor offset"))?;
            if offset.checked_add(len).is_none_or(|e| e > buf.len()) {
                return Err(Error::BadFile {
                    path: path.to_path_buf(),
                    msg: format!(
                        "tensor '{name}' ({dtype}, {len} bytes at offset {offset}) lies past the end of the file ({} bytes): the file is truncated",
                        buf.len()
                    ),
                });
            }
            let shape: Vec<usize> = dims.iter().rev().copied().collect();
            tensors.push(GgufTensorInfo {
                name,
                shape,
                dtype,
                file: 0,
                offset,
                len,
            });
        }
        // Regions must not overlap (each byte belongs to one tensor), names must be unique.
        let mut order: Vec<&GgufTensorInfo> = tensors.iter().collect();
        order.sort_by_key(|t| (t.offset, t.len));
        for w in order.windows(2) {
            if w[1].offset < w[0].offset + w[0].len {
                return Err(r.err(&format!(
                    "tensors '{}' and '{}' overlap (bytes {}..{} and {}..{})",
                    w[0].name,
                    w[1].name,
                    w[0].offset,
                    w[0].offset + w[0].len,
                    w[1].offset,
                    w[1].offset + w[1].len
                )));
            }
        }
        // As llama.cpp's reader: each tensor starts where the one before it ends, padded to
        // the alignment, in the order the header lists them (no gaps, no reordering).
        let mut expected = data_start;
        for t in &tensors {
            if t.offset != expected {
                return Err(r.err(&format!(
                    "tensor '{}' starts at data offset {}, expected {} (the end of the tensor \
                     before it, padded to {alignment} bytes, as llama.cpp requires)",
                    t.name,
                    t.offset - data_start,
                    expected - data_start
                )));
            }
            expected += t.len.div_ceil(alignment) * alignment;
        }
        let mut names: Vec<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(r.err(&format!("tensor '{}' appears twice", w[0])));
        }
        Ok(GgufFile {
            path: path.to_path_buf(),
            version,
            metadata,
            kv_order,
            tensors,
            parts: vec![path.to_path_buf()],
            maps: vec![map],
            file_backed: false,
        })
    }

    pub fn meta(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Option<&str> {
        self.meta("general.architecture").and_then(|v| v.as_str())
    }

    pub fn tensor_info(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The named tensor as a view into the memory map.
    pub fn tensor(&self, name: &str) -> Option<Tensor> {
        let t = self.tensor_info(name)?;
        let map = self.maps[t.file].clone();
        let view = Tensor::from_mmap(t.dtype, t.shape.clone(), map, t.offset, t.len);
        Some(if self.file_backed {
            view.in_file_map()
        } else {
            view
        })
    }
}
