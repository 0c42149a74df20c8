//! `lone._lone`: the native half of the `lone` Python package (the Python half, in
//! `python/lone/`, is the documented API). A model here is the server's engine in this
//! process ([`lone::serve::local::Local`]): requests are the HTTP endpoints' JSON bodies and
//! answers their JSON, so the Python API and `lone serve` share templates, tool calls,
//! constraints, sampling and validation. Every call that computes releases the GIL.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lone::cli::report;
use lone::serve::local::{self, Local, Request, Step};
use lone::serve::openai::{ApiError, Kind};
use lone::serve::{Background, ServeArgs};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use serde_json::Value;

create_exception!(
    _lone,
    LoneError,
    PyException,
    "An error from lone: `status` (the HTTP status the server would answer), `type`, `code` and `param` as in OpenAI's error objects."
);

/// A `LoneError` carrying an API error's fields.
fn api_err(py: Python<'_>, e: ApiError) -> PyErr {
    let body = e.body();
    let err = &body["error"];
    let msg = err["message"].as_str().unwrap_or("error").to_string();
    let pe = LoneError::new_err(msg);
    let v = pe.value(py);
    let _ = v.setattr("status", e.status.as_u16());
    for k in ["type", "code", "param"] {
        let _ = v.setattr(k, err[k].as_str());
    }
    pe
}

/// A `LoneError` from anything else that went wrong (loading, arguments).
fn any_err(py: Python<'_>, e: impl std::fmt::Display) -> PyErr {
    let pe = LoneError::new_err(e.to_string());
    let v = pe.value(py);
    let _ = v.setattr("status", 400u16);
    for k in ["type", "code", "param"] {
        let _ = v.setattr(k, None::<&str>);
    }
    pe
}

fn parse_json(py: Python<'_>, s: &str) -> PyResult<Value> {
    serde_json::from_str(s).map_err(|e| any_err(py, format!("bad JSON from the wrapper: {e}")))
}

/// `lone serve`'s `flags` with the per-model `mode` and `cache_type`.
fn serve_args(
    py: Python<'_>,
    flags: Vec<String>,
    mode: Option<&str>,
    cache_type: Option<&str>,
) -> PyResult<ServeArgs> {
    let mut a = local::serve_args(flags).map_err(|e| any_err(py, e))?;
    a.mode = parse_mode(mode)?;
    a.cache_type = parse_cache_type(cache_type)?;
    Ok(a)
}

fn parse_mode(mode: Option<&str>) -> PyResult<Option<lone_core::kernels::Mode>> {
    mode.map(|m| local::mode_named(m).map_err(|e| PyValueError::new_err(format!("mode {e}"))))
        .transpose()
}

fn parse_cache_type(t: Option<&str>) -> PyResult<Option<lone_core::cache::KvType>> {
    t.map(|t| {
        local::cache_type_named(t).map_err(|e| PyValueError::new_err(format!("cache_type {e}")))
    })
    .transpose()
}

/// A loaded model and its engine. The lock is held only to clone or take the `Arc` (never
/// while the GIL is released: a thread waiting for it with the GIL would deadlock one that
/// needs the GIL back); a call in flight keeps the model alive through its clone.
#[pyclass(module = "lone._lone", frozen)]
struct NativeModel {
    local: Mutex<Option<Arc<Local>>>,
}

impl NativeModel {
    fn with<T>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&Local) -> Result<T, ApiError> + Send,
    ) -> PyResult<T>
    where
        T: Send,
    {
        let local = self
            .local
            .lock()
            .map_err(|_| any_err(py, "the model's lock is poisoned"))?
            .clone()
            .ok_or_else(|| any_err(py, "the model is closed"))?;
        // The clone is dropped without the GIL too: the last one stops the engine thread.
        py.detach(move || {
            let r = f(&local);
            drop(local);
            r
        })
        .map_err(|e| api_err(py, e))
    }
}

#[pymethods]
impl NativeModel {
    /// Load a model: `flags` are `lone serve`'s (`--model PATH`, `--ctx N`, ...); `mode` is
    /// `auto`, `exact` or `fast`; `cache_type` `f16`, `f32` or `q8_0`.
    #[new]
    #[pyo3(signature = (flags, mode=None, cache_type=None))]
    fn new(
        py: Python<'_>,
        flags: Vec<String>,
        mode: Option<&str>,
        cache_type: Option<&str>,
    ) -> PyResult<Self> {
        let a = serve_args(py, flags, mode, cache_type)?;
        let local = py
            .detach(|| Local::open(&a))
            .map_err(|e| any_err(py, report(&e)))?;
        Ok(NativeModel {
            local: Mutex::new(Some(Arc::new(local))),
        })
    }

    /// The model's description (JSON): id, path, architecture, quantization, sizes.
    fn info(&self, py: Python<'_>) -> PyResult<String> {
        self.with(py, |l| Ok(l.info().to_string()))
    }

    fn tokenize(&self, py: Python<'_>, text: &str, add_special: bool) -> PyResult<Vec<u32>> {
        self.with(py, |l| l.tokenize(text, add_special))
    }

    fn detokenize(&self, py: Python<'_>, ids: Vec<u32>) -> PyResult<String> {
        self.with(py, |l| l.detokenize(&ids))
    }

    /// The prompt a chat request (JSON with `messages`, optional `tools`) renders to.
    fn apply_template(&self, py: Python<'_>, body: &str) -> PyResult<String> {
        let v = parse_json(py, body)?;
        self.with(py, |l| l.apply_template(&v))
    }

    /// Start a request: `kind` `chat` or `completion`, `body` the endpoint's JSON.
    fn request(&self, py: Python<'_>, kind: &str, body: &str) -> PyResult<NativeRequest> {
        let kind = match kind {
            "chat" => Kind::Chat,
            "completion" => Kind::Completion,
            k => return Err(PyValueError::new_err(format!("unknown request kind {k:?}"))),
        };
        let v = parse_json(py, body)?;
        let req = self.with(py, |l| l.request(kind, &v))?;
        Ok(NativeRequest {
            req: Mutex::new(Some(req)),
        })
    }

    /// The answer (JSON) to an embeddings request (JSON).
    fn embeddings(&self, py: Python<'_>, body: &str) -> PyResult<String> {
        let v = parse_json(py, body)?;
        self.with(py, |l| l.embeddings(&v).map(|r| r.to_string()))
    }

    /// The logits of `ids` from position 0 as little-endian f32 bytes: the last position's
    /// `[vocab]`, or every position's `[len(ids), vocab]` with `all`.
    fn logits<'py>(
        &self,
        py: Python<'py>,
        ids: Vec<u32>,
        all: bool,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let v = self.with(py, |l| l.logits(&ids, all))?;
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        Ok(PyBytes::new(py, &bytes))
    }

    /// Perplexity of `text` (JSON: ppl, stderr, scored tokens, chunks, running values).
    #[pyo3(signature = (text, ctx, chunks=None))]
    fn perplexity(
        &self,
        py: Python<'_>,
        text: &str,
        ctx: usize,
        chunks: Option<usize>,
    ) -> PyResult<String> {
        let r = self.with(py, |l| l.perplexity(text, ctx, chunks))?;
        Ok(serde_json::json!({
            "ppl": r.ppl, "stderr": r.stderr, "scored": r.scored, "chunks": r.chunks,
            "running": r.running,
        })
        .to_string())
    }

    /// Stop the engine and free the model (also when the object is collected).
    fn close(&self, py: Python<'_>) {
        let taken = self.local.lock().ok().and_then(|mut g| g.take());
        py.detach(move || drop(taken));
    }
}

/// A request in flight; dropping it cancels its sequences.
#[pyclass(module = "lone._lone", frozen)]
struct NativeRequest {
    req: Mutex<Option<Request>>,
}

#[pymethods]
impl NativeRequest {
    /// The next thing the request has, waiting at most `wait_ms`: `("wait", None)`,
    /// `("chunk", json)`, `("response", json)` or `("end", None)`.
    fn next(&self, py: Python<'_>, wait_ms: u64) -> PyResult<(&'static str, Option<String>)> {
        // The lock is taken with the GIL released (see `NativeModel`).
        let step = py.detach(|| {
            let mut g = self.req.lock().ok()?;
            let req = g.as_mut()?;
            let step = req.next(Duration::from_millis(wait_ms));
            if !matches!(step, Ok(Step::Wait | Step::Chunk(_))) {
                *g = None;
            }
            Some(step)
        });
        match step {
            None => Ok(("end", None)),
            Some(Ok(Step::Wait)) => Ok(("wait", None)),
            Some(Ok(Step::Chunk(c))) => Ok(("chunk", Some(c.to_string()))),
            Some(Ok(Step::Response(r))) => Ok(("response", Some(r.to_string()))),
            Some(Ok(Step::End)) => Ok(("end", None)),
            Some(Err(e)) => Err(api_err(py, e)),
        }
    }

    /// Stop generating (the sequences are cancelled; nothing more comes).
    fn cancel(&self, py: Python<'_>) {
        py.detach(|| drop(self.req.lock().ok().and_then(|mut g| g.take())));
    }
}

/// `lone serve` running on a thread of this process.
#[pyclass(module = "lone._lone", frozen)]
struct NativeServer {
    bg: Mutex<Option<Background>>,
    addr: String,
}

#[pymethods]
impl NativeServer {
    /// Bind and start serving with `lone serve`'s `flags`.
    #[new]
    #[pyo3(signature = (flags, mode=None, cache_type=None))]
    fn new(
        py: Python<'_>,
        flags: Vec<String>,
        mode: Option<&str>,
        cache_type: Option<&str>,
    ) -> PyResult<Self> {
        let a = serve_args(py, flags, mode, cache_type)?;
        let bg = py
            .detach(|| Background::start(a))
            .map_err(|e| any_err(py, report(&e)))?;
        Ok(NativeServer {
            addr: bg.addr().to_string(),
            bg: Mutex::new(Some(bg)),
        })
    }

    /// `host:port` it listens on.
    #[getter]
    fn address(&self) -> String {
        self.addr.clone()
    }

    /// Stop serving and unload its models.
    fn stop(&self, py: Python<'_>) -> PyResult<()> {
        let taken = self.bg.lock().ok().and_then(|mut g| g.take());
        match taken {
            Some(mut bg) => py
                .detach(move || bg.stop())
                .map_err(|e| any_err(py, report(&e))),
            None => Ok(()),
        }
    }
}

/// Run the `lone` command line (`argv[0]` is the program name); its exit status.
#[pyfunction]
fn cli(py: Python<'_>, argv: Vec<String>) -> i32 {
    py.detach(|| lone::cli::main_with(argv.into_iter().map(Into::into)))
}

#[pymodule]
fn _lone(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("LoneError", m.py().get_type::<LoneError>())?;
    m.add_class::<NativeModel>()?;
    m.add_class::<NativeRequest>()?;
    m.add_class::<NativeServer>()?;
    m.add_function(wrap_pyfunction!(cli, m)?)?;
    Ok(())
}
