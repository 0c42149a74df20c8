//! Split GGUF files, as llama.cpp's `llama-gguf-split` writes and merges them.
//!
//! A split is `PREFIX-00001-of-0000N.gguf` … `PREFIX-0000N-of-0000N.gguf`: the first part
//! carries every metadata key of the whole file, each part its own tensors (in the whole
//! file's order) and the keys `split.no` (u16, 0-based), `split.count` (u16) and
//! `split.tensors.count` (i32, the whole file's tensor count). The loader
//! ([`GgufFile::open`]) opens such a set from its first part.

use std::path::{Path, PathBuf};

use super::{Plan, ALIGNMENT};
use crate::error::{Error, Result};
use crate::loader::gguf::{
    split_path, split_prefix, GgufFile, MetaValue, SPLIT_COUNT, SPLIT_NO, SPLIT_TENSORS,
};

/// Where to cut (`--split-max-tensors` / `--split-max-size`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SplitBy {
    /// At most this many tensors per part.
    Tensors(usize),
    /// At most this many bytes of (padded) tensor data per part.
    Bytes(u64),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitOptions {
    pub by: SplitBy,
    /// The first part holds only the metadata (`--no-tensor-first-split`).
    pub no_tensor_first_split: bool,
}

/// `N` followed by `M` (10^6 bytes) or `G` (10^9), as llama-gguf-split reads
/// `--split-max-size`.
pub fn parse_size(s: &str) -> Result<u64> {
    let bad = || {
        Error::Config(format!(
            "split size {s:?}: give a positive whole number followed by M (megabytes) or G (gigabytes), e.g. 2G"
        ))
    };
    let (num, unit) = s.split_at(s.len().saturating_sub(1));
    let mult: u64 = match unit {
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        _ => return Err(bad()),
    };
    let n: u64 = num.parse().map_err(|_| bad())?;
    if n == 0 {
        return Err(bad());
    }
    n.checked_mul(mult).ok_or_else(bad)
}

/// The parts of `plan` split as llama-gguf-split splits the file `plan` describes.
pub fn split(plan: &Plan, opts: SplitOptions) -> Result<Vec<Plan>> {
    if opts.by == SplitBy::Tensors(0) {
        return Err(Error::Config(
            "--split-max-tensors must be at least 1".into(),
        ));
    }
    let n_tensors = plan.tensors.len();
    let mut parts: Vec<Plan> = Vec::new();
    let mut cur: Option<Plan> = None;
    // llama-gguf-split's `new_ctx_out`: the first part takes every key, then each part its
    // split keys (`gguf_set_val_*` removes a key and appends it).
    let mut new_part = |cur: &mut Option<Plan>, allow_empty: bool| -> Result<()> {
        if let Some(p) = cur.take() {
            if p.tensors.is_empty() && !allow_empty {
                return Err(Error::Config(
                    "a split part would hold no tensors: the size or tensor limit is too small \
                     (a single tensor is larger than --split-max-size?)"
                        .into(),
                ));
            }
            parts.push(p);
        }
        let mut p = Plan::default();
        if parts.is_empty() {
            p.kv = plan.kv.clone();
        }
        p.set_last(SPLIT_NO, MetaValue::U16(parts.len() as u16));
        p.set_last(SPLIT_COUNT, MetaValue::U16(0));
        p.set_last(SPLIT_TENSORS, MetaValue::I32(n_tensors as i32));
        *cur = Some(p);
        Ok(())
    };
    new_part(&mut cur, false)?;
    if opts.no_tensor_first_split {
        new_part(&mut cur, true)?;
    }
    let mut size = 0u64;
    for (i, t) in plan.tensors.iter().enumerate() {
        let n_bytes = (t.n_bytes().div_ceil(ALIGNMENT) * ALIGNMENT) as u64;
        let next = size + n_bytes;
        let cut = match opts.by {
            SplitBy::Bytes(max) => next > max,
            SplitBy::Tensors(max) => i > 0 && i % max == 0,
        };
        if cut {
            new_part(&mut cur, false)?;
            size = n_bytes;
        } else {
            size = next;
        }
        cur.as_mut()
            .expect("a part is open")
            .tensors
            .push(t.clone());
    }
    parts.extend(cur);
    let count = parts.len();
    if count > u16::MAX as usize {
        return Err(Error::Config(format!(
            "{count} parts: a split holds at most {} (raise the limit)",
            u16::MAX
        )));
    }
    for p in &mut parts {
        p.set_last(SPLIT_COUNT, MetaValue::U16(count as u16));
    }
    Ok(parts)
}

/// The parts of `plan` (a requantization of the GGUF `source`) cut where `source` is cut, as
/// `llama-quantize --keep-split` writes them: each tensor in the part its source tensor is in,
/// in the source's order (part, then offset); the first part has every key, the others none
/// but the split keys (`split.no`, `split.count`, `split.tensors.count`, in that order),
/// which a one-part source does not get. Name the parts with [`part_paths`].
pub fn keep_split(plan: &Plan, source: &GgufFile) -> Result<Vec<Plan>> {
    let place: std::collections::HashMap<&str, (usize, usize)> = source
        .tensors
        .iter()
        .map(|t| (t.name.as_str(), (t.file, t.offset)))
        .collect();
    let mut placed = Vec::with_capacity(plan.tensors.len());
    for t in &plan.tensors {
        let Some(&at) = place.get(t.name.as_str()) else {
            return Err(Error::Config(format!(
                "--keep-split: tensor '{}' is not in {}",
                t.name,
                source.path.display()
            )));
        };
        placed.push((at, t));
    }
    placed.sort_by_key(|(at, _)| *at);
    let count = placed.iter().map(|((f, _), _)| f + 1).max().unwrap_or(1);
    let mut parts: Vec<Plan> = (0..count).map(|_| Plan::default()).collect();
    parts[0].kv = plan.kv.clone();
    for ((file, _), t) in placed {
        parts[file].tensors.push(t.clone());
    }
    if let Some(i) = (1..count).find(|&i| parts[i].tensors.is_empty()) {
        return Err(Error::Config(format!(
            "--keep-split: part {} of {} holds no tensors of the output",
            i + 1,
            source.path.display()
        )));
    }
    if count > 1 {
        for (i, p) in parts.iter_mut().enumerate() {
            p.set_last(SPLIT_NO, MetaValue::U16(i as u16));
            p.set_last(SPLIT_COUNT, MetaValue::U16(count as u16));
            p.set_last(SPLIT_TENSORS, MetaValue::I32(plan.tensors.len() as i32));
        }
    }
    Ok(parts)
}

/// The part paths for `out` (`NAME.gguf` or a bare prefix): `NAME-00001-of-0000N.gguf`, ….
pub fn part_paths(out: &Path, count: usize) -> Vec<PathBuf> {
    let s = out.to_string_lossy();
    let prefix = s.strip_suffix(".gguf").unwrap_or(&s);
    (0..count).map(|i| split_path(prefix, i, count)).collect()
}

/// The one-file plan of an opened split (llama-gguf-split `--merge`): the first part's keys
/// with `split.count` set to 0 (so the result is not read as a split again), every part's
/// tensors in order.
pub fn merge(g: &GgufFile) -> Result<Plan> {
    let Some(n) = g.meta(SPLIT_COUNT).and_then(MetaValue::as_u64) else {
        return Err(Error::BadFile {
            path: g.path.clone(),
            msg: format!("not a split GGUF (no {SPLIT_COUNT} key): nothing to merge"),
        });
    };
    // llama-gguf-split: "input file does not contain a valid split count".
    if n < 1 {
        return Err(Error::BadFile {
            path: g.path.clone(),
            msg: format!(
                "not a valid split count {n} ({SPLIT_COUNT}; a merged file has 0): nothing to merge"
            ),
        });
    }
    if split_prefix(&g.path, 0, g.parts.len()).is_none() {
        return Err(Error::BadFile {
            path: g.path.clone(),
            msg: format!(
                "a split's first part must be named PREFIX-00001-of-{:05}.gguf",
                g.parts.len()
            ),
        });
    }
    let mut plan = Plan::from_gguf(g)?;
    plan.set_last(SPLIT_COUNT, MetaValue::U16(0));
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_as_llama_gguf_split_reads_them() {
        assert_eq!(parse_size("40M").unwrap(), 40_000_000);
        assert_eq!(parse_size("2G").unwrap(), 2_000_000_000);
        for bad in [
            "",
            "M",
            "0M",
            "2K",
            "2",
            "-1G",
            "1.5G",
            "99999999999999999999G",
        ] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn part_names_follow_llama_cpp() {
        let p = part_paths(Path::new("/m/x.gguf"), 3);
        assert_eq!(p[0], PathBuf::from("/m/x-00001-of-00003.gguf"));
        assert_eq!(p[2], PathBuf::from("/m/x-00003-of-00003.gguf"));
        assert_eq!(
            split_prefix(&p[1], 1, 3).as_deref(),
            Some("/m/x"),
            "the prefix comes back"
        );
        assert_eq!(split_prefix(&p[1], 0, 3), None);
        assert_eq!(split_prefix(Path::new("-00001-of-00003.gguf"), 0, 3), None);
    }
}
