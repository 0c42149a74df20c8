//! The library's error type: each message says what was wrong and, where possible, what to do.

use std::path::{Path, PathBuf};

use thiserror::Error;

#[derive(Debug, Error)]
pub enum Error {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {msg}")]
    BadFile { path: PathBuf, msg: String },
    #[error("{0}")]
    Config(String),
    #[error("missing tensor '{name}' in {source_desc}")]
    MissingTensor { name: String, source_desc: String },
    #[error("tensor '{name}' has shape {got:?}, expected {expected:?}")]
    BadShape {
        name: String,
        got: Vec<usize>,
        expected: Vec<usize>,
    },
    #[error("unsupported model: {0}")]
    Unsupported(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    Template(String),
    #[error("{0}")]
    Input(String),
    #[error("{0}")]
    Msg(String),
}

impl Error {
    pub fn io(path: &Path, source: std::io::Error) -> Error {
        Error::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// `path` must be a regular file: a named pipe or a device would block or never end.
pub fn check_regular(path: &Path) -> Result<()> {
    let m = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    if m.is_file() {
        Ok(())
    } else {
        Err(Error::BadFile {
            path: path.to_path_buf(),
            msg: "not a regular file (a directory, pipe or device); give a model file".into(),
        })
    }
}

/// Open a regular file.
pub fn open_regular(path: &Path) -> Result<std::fs::File> {
    check_regular(path)?;
    std::fs::File::open(path).map_err(|e| Error::io(path, e))
}

/// Read a regular file as UTF-8 text.
pub fn read_text(path: &Path) -> Result<String> {
    check_regular(path)?;
    std::fs::read_to_string(path).map_err(|e| Error::io(path, e))
}

/// Read a regular file as JSON.
pub fn read_json(path: &Path) -> Result<serde_json::Value> {
    serde_json::from_str(&read_text(path)?).map_err(|e| Error::BadFile {
        path: path.to_path_buf(),
        msg: format!("invalid JSON: {e}"),
    })
}

/// Read a regular file's bytes.
pub fn read_bytes(path: &Path) -> Result<Vec<u8>> {
    check_regular(path)?;
    std::fs::read(path).map_err(|e| Error::io(path, e))
}
