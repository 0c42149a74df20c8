//! Hugging Face safetensors checkpoints (single file or sharded), memory-mapped.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use safetensors::{Dtype as StDtype, SafeTensors};

use crate::error::{Error, Result};
use crate::tensor::{DType, Tensor};

/// All tensors of a checkpoint directory, by HF name.
pub struct SafetensorsFiles {
    pub dir: PathBuf,
    tensors: HashMap<String, Tensor>,
    /// Names file by file (files in name order), each file's names sorted: the order
    /// llama.cpp's converter writes them in.
    order: Vec<String>,
}

fn open_one(path: &Path, out: &mut HashMap<String, Tensor>, order: &mut Vec<String>) -> Result<()> {
    let file = crate::error::open_regular(path)?;
    // SAFETY: read-only map of a model file that lone never writes while it is loaded.
    let map = Arc::new(unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?);
    read_map(path, map, out, order)
}

fn read_map(
    path: &Path,
    map: Arc<Mmap>,
    out: &mut HashMap<String, Tensor>,
    order: &mut Vec<String>,
) -> Result<()> {
    let st = SafeTensors::deserialize(&map).map_err(|e| Error::BadFile {
        path: path.to_path_buf(),
        msg: format!("not a valid safetensors file ({e}); is it truncated or corrupt?"),
    })?;
    let base = map.as_ptr() as usize;
    let mut names: Vec<String> = st.names().into_iter().map(str::to_string).collect();
    names.sort();
    order.extend(names);
    for (name, view) in st.tensors() {
        let dtype = match view.dtype() {
            StDtype::F32 => DType::F32,
            StDtype::F16 => DType::F16,
            StDtype::BF16 => DType::BF16,
            other => {
                return Err(Error::BadFile {
                    path: path.to_path_buf(),
                    msg: format!(
                    "tensor '{name}' has dtype {other:?}; lone loads F32, F16 and BF16 checkpoints"
                ),
                })
            }
        };
        let data = view.data();
        let offset = data.as_ptr() as usize - base;
        let shape = view.shape().to_vec();
        out.insert(
            name,
            Tensor::from_mmap(dtype, shape, map.clone(), offset, data.len()),
        );
    }
    Ok(())
}

impl SafetensorsFiles {
    /// One safetensors file held in memory (`label` names it in errors): what the fuzz
    /// targets read.
    pub fn from_bytes(label: &Path, bytes: &[u8]) -> Result<SafetensorsFiles> {
        let map = Arc::new(super::anon_map(label, bytes)?);
        let (mut tensors, mut order) = (HashMap::new(), Vec::new());
        read_map(label, map, &mut tensors, &mut order)?;
        Ok(SafetensorsFiles {
            dir: label.to_path_buf(),
            tensors,
            order,
        })
    }

    /// Open `model.safetensors` or the shards listed in `model.safetensors.index.json` in `dir`.
    pub fn open_dir(dir: &Path) -> Result<SafetensorsFiles> {
        let mut tensors = HashMap::new();
        let mut order = Vec::new();
        let single = dir.join("model.safetensors");
        let index = dir.join("model.safetensors.index.json");
        if single.exists() {
            open_one(&single, &mut tensors, &mut order)?;
        } else if index.exists() {
            let text = crate::error::read_text(&index)?;
            let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| Error::BadFile {
                path: index.clone(),
                msg: format!("invalid JSON: {e}"),
            })?;
            let map = v
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| Error::BadFile {
                    path: index.clone(),
                    msg: "no \"weight_map\" object".into(),
                })?;
            let mut files: Vec<&str> = map.values().filter_map(|f| f.as_str()).collect();
            files.sort();
            files.dedup();
            for f in files {
                if f.contains('/') || f.contains("..") {
                    return Err(Error::BadFile {
                        path: index.clone(),
                        msg: format!("bad shard name {f:?}"),
                    });
                }
                open_one(&dir.join(f), &mut tensors, &mut order)?;
            }
        } else {
            // Any *.safetensors files at all?
            let mut found = false;
            if let Ok(rd) = std::fs::read_dir(dir) {
                let mut paths: Vec<PathBuf> = rd
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
                    .collect();
                paths.sort();
                for p in paths {
                    open_one(&p, &mut tensors, &mut order)?;
                    found = true;
                }
            }
            if !found {
                return Err(Error::BadFile {
                    path: dir.to_path_buf(),
                    msg:
                        "no model.safetensors, model.safetensors.index.json or *.safetensors found"
                            .into(),
                });
            }
        }
        Ok(SafetensorsFiles {
            dir: dir.to_path_buf(),
            tensors,
            order,
        })
    }

    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.tensors.get(name)
    }

    /// Tensor names in llama.cpp's converter order (see the `order` field).
    pub fn ordered_names(&self) -> &[String] {
        &self.order
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(|s| s.as_str())
    }
}
