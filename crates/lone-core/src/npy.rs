//! Minimal .npy (NumPy format v1/v2) for f32 and i64 arrays: reference fixtures in, dumped
//! logits out.

use std::io::Write;
use std::path::Path;

use crate::error::{Error, Result};

/// An array read from a .npy file, converted to f32.
#[derive(Clone, Debug)]
pub struct NpyArray {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

fn bad(path: &Path, msg: impl Into<String>) -> Error {
    Error::BadFile {
        path: path.to_path_buf(),
        msg: msg.into(),
    }
}

/// Read a little-endian f32, f16, f64 or integer array in C order.
pub fn read(path: &Path) -> Result<NpyArray> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err(bad(path, "not a .npy file"));
    }
    let major = bytes[6];
    let (hlen, hstart) = if major == 1 {
        (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10)
    } else {
        if bytes.len() < 12 {
            return Err(bad(path, "truncated .npy header"));
        }
        (
            u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize,
            12,
        )
    };
    let header = bytes
        .get(hstart..hstart + hlen)
        .and_then(|h| std::str::from_utf8(h).ok())
        .ok_or_else(|| bad(path, "truncated .npy header"))?;
    let field = |name: &str| -> Option<&str> {
        let i = header.find(&format!("'{name}':"))?;
        Some(header[i + name.len() + 3..].trim_start())
    };
    let descr = field("descr")
        .and_then(|s| s.strip_prefix('\''))
        .and_then(|s| s.split('\'').next())
        .ok_or_else(|| bad(path, "no descr"))?;
    if field("fortran_order").is_some_and(|s| s.starts_with("True")) {
        return Err(bad(path, "Fortran-order arrays are not supported"));
    }
    let shape_s = field("shape")
        .and_then(|s| s.strip_prefix('('))
        .and_then(|s| s.split(')').next())
        .ok_or_else(|| bad(path, "no shape"))?;
    let shape: Vec<usize> = shape_s
        .split(',')
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().map_err(|_| bad(path, "bad shape")))
        .collect::<Result<_>>()?;
    let n: usize = shape.iter().product();
    let body = &bytes[hstart + hlen..];
    let (size, conv): (usize, fn(&[u8]) -> f32) = match descr {
        "<f4" => (4, |b| f32::from_le_bytes(b.try_into().unwrap())),
        "<f8" => (8, |b| f64::from_le_bytes(b.try_into().unwrap()) as f32),
        "<f2" => (2, |b| {
            half::f16::from_le_bytes(b.try_into().unwrap()).to_f32()
        }),
        "<i8" => (8, |b| i64::from_le_bytes(b.try_into().unwrap()) as f32),
        "<i4" => (4, |b| i32::from_le_bytes(b.try_into().unwrap()) as f32),
        other => return Err(bad(path, format!("unsupported dtype {other}"))),
    };
    if body.len() < n * size {
        return Err(bad(path, "truncated .npy data"));
    }
    let data = body[..n * size].chunks_exact(size).map(conv).collect();
    Ok(NpyArray { shape, data })
}

/// Write an f32 array of `shape` in C order (.npy v1).
pub fn write_f32(path: &Path, shape: &[usize], data: &[f32]) -> Result<()> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape_s = if dims.len() == 1 {
        format!("({},)", dims[0])
    } else {
        format!("({})", dims.join(", "))
    };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape_s}, }}");
    // Pad so that data starts at a multiple of 64 bytes; the header ends with '\n'.
    let total = 10 + header.len() + 1;
    header.push_str(&" ".repeat((64 - total % 64) % 64));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + data.len() * 4);
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for v in data {
        out.extend_from_slice(&v.to_le_bytes());
    }
    let mut f = std::fs::File::create(path).map_err(|e| Error::io(path, e))?;
    f.write_all(&out).map_err(|e| Error::io(path, e))
}
