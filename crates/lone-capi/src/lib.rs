//! lone's C API: `liblone.so` / `liblone.a` and `include/lone.h`.
//!
//! A model opened here is the server's engine running in the calling process
//! (`lone_rt::serve::local::Local`): requests are the JSON bodies `POST /v1/completions` and
//! `/v1/chat/completions` take, answers the JSON they return, so C programs, Python and
//! `lone serve` share templates, tool calls, constraints, sampling and validation.
//!
//! Conventions (they are also the header's):
//! - Every function that can fail returns a `lone_status`; `LONE_OK` is 0. After a failure,
//!   `lone_last_error()` says what was wrong on the calling thread. Outputs are written only
//!   on success (and on `LONE_ERR_CANCELLED`, which keeps what was generated).
//! - Every string the library returns through a `char **` is freed with `lone_string_free`.
//! - A model is thread-safe: several threads may use one model (and their own sequences) at
//!   once, and the engine batches their generations together. A sequence must be used by one
//!   thread at a time.
//! - A sequence holds a reference to its model: the model stays loaded until it and all its
//!   sequences are freed.
//! - Nothing unwinds across the boundary: a panic inside the library is caught and reported
//!   as `LONE_ERR_PANIC`. Callbacks must not unwind (throw C++ exceptions or `longjmp`) either.
#![allow(non_camel_case_types)]
#![deny(unsafe_op_in_unsafe_fn)]

use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;

use lone_rt::cli::report;
use lone_rt::serve::local::{Local, Request, Step};
use lone_rt::serve::openai::{ApiError, Kind};
use lone_rt::serve::ServeArgs;
use serde_json::{json, Map, Value};

/// What a call did. `LONE_OK` (0) is success; everything else sets the message that
/// `lone_last_error()` returns.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum lone_status {
    /// Success.
    LONE_OK = 0,
    /// A bad argument or request (a NULL pointer, text that is not UTF-8, bad JSON, an
    /// unknown option, a token id out of the vocabulary, a request the server would answer
    /// with a 4xx status). Fix the call.
    LONE_ERR_INVALID = 1,
    /// The model cannot be loaded (missing or damaged file, unsupported architecture).
    LONE_ERR_LOAD = 2,
    /// The caller's buffer is too small; the size needed was written to `*n_out`.
    LONE_ERR_BUFFER = 3,
    /// The engine failed or stopped (what the server answers with a 5xx status).
    LONE_ERR_RUNTIME = 4,
    /// A bug in lone (a caught panic); the message says where. Please report it.
    LONE_ERR_PANIC = 5,
    /// The callback returned false, and generation stopped. Not a failure of the call: what
    /// was generated before the stop is kept, and the outputs are written as on success.
    LONE_ERR_CANCELLED = 6,
}

/// A loaded model and its engine (opaque). Open with `lone_model_open`, free with
/// `lone_model_free`.
pub struct lone_model {
    local: Arc<Local>,
}

/// A sequence of token ids that generation continues (opaque). It keeps its model loaded.
/// Create with `lone_seq_new`, free with `lone_seq_free`.
pub struct lone_seq {
    local: Arc<Local>,
    ids: Vec<u32>,
}

/// Receives generated text as it is decoded: `piece` is `len` bytes of UTF-8 (whole
/// characters), NUL-terminated, valid only during the call; `user` is the pointer given
/// with the callback. Return true to go on, false to stop generating.
pub type lone_text_fn =
    Option<unsafe extern "C" fn(piece: *const c_char, len: usize, user: *mut c_void) -> bool>;

// ---------------------------------------------------------------------------------------
// Errors

/// A failed call: its status and message.
struct Failure {
    status: lone_status,
    message: String,
}

type Res<T> = Result<T, Failure>;

impl Failure {
    fn new(status: lone_status, message: impl Into<String>) -> Failure {
        Failure {
            status,
            message: message.into(),
        }
    }
}

fn invalid(message: impl Into<String>) -> Failure {
    Failure::new(lone_status::LONE_ERR_INVALID, message)
}

fn null_arg(name: &str) -> Failure {
    invalid(format!("{name} is NULL; pass a valid pointer"))
}

impl From<ApiError> for Failure {
    fn from(e: ApiError) -> Failure {
        let status = if e.status.is_client_error() {
            lone_status::LONE_ERR_INVALID
        } else {
            lone_status::LONE_ERR_RUNTIME
        };
        let mut message = e.message;
        if let Some(p) = e.param.filter(|p| !message.contains(p.as_str())) {
            message.push_str(&format!(" (in `{p}`)"));
        }
        Failure::new(status, message)
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(message: &str) {
    let c = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    // `try_with`: during the thread's teardown the message is dropped, never a panic.
    let _ = LAST_ERROR.try_with(|e| *e.borrow_mut() = c);
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    let what = p
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string());
    format!("internal error in lone (a bug; please report it): {what}")
}

/// Runs an entry point's body: clears the thread's last error, catches panics, and turns
/// the result into a status (setting the last error on failure).
fn guard(f: impl FnOnce() -> Res<()>) -> lone_status {
    set_last_error("");
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => lone_status::LONE_OK,
        Ok(Err(fail)) => {
            set_last_error(&fail.message);
            fail.status
        }
        Err(p) => {
            set_last_error(&panic_message(p.as_ref()));
            lone_status::LONE_ERR_PANIC
        }
    }
}

/// Runs a function that returns nothing (the `_free`s), swallowing any panic.
fn guard_void(f: impl FnOnce()) {
    if let Err(p) = catch_unwind(AssertUnwindSafe(f)) {
        set_last_error(&panic_message(p.as_ref()));
    }
}

// ---------------------------------------------------------------------------------------
// Pointers from C (the only unsafe code)

/// A C string argument that may be NULL.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string that stays valid for `'a`.
unsafe fn opt_str<'a>(p: *const c_char, name: &str) -> Res<Option<&'a str>> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: non-NULL, and the caller guarantees a NUL-terminated string valid for 'a.
    let c = unsafe { CStr::from_ptr(p) };
    c.to_str().map(Some).map_err(|e| {
        invalid(format!(
            "{name} is not valid UTF-8 (bad byte at offset {}); pass UTF-8 text",
            e.valid_up_to()
        ))
    })
}

/// A C string argument that must not be NULL.
///
/// # Safety
/// As [`opt_str`].
unsafe fn req_str<'a>(p: *const c_char, name: &str) -> Res<&'a str> {
    // SAFETY: forwarded from the caller.
    unsafe { opt_str(p, name) }?.ok_or_else(|| null_arg(name))
}

/// A pointer argument to read from.
///
/// # Safety
/// `p` is NULL or points to a live `T` for `'a`.
unsafe fn arg<'a, T>(p: *const T, name: &str) -> Res<&'a T> {
    // SAFETY: the caller guarantees NULL or a valid, aligned, live T.
    unsafe { p.as_ref() }.ok_or_else(|| null_arg(name))
}

/// A pointer argument to write to (or to change).
///
/// # Safety
/// `p` is NULL or points to a live `T` for `'a` that nothing else uses meanwhile.
unsafe fn arg_mut<'a, T>(p: *mut T, name: &str) -> Res<&'a mut T> {
    // SAFETY: the caller guarantees NULL or a valid, aligned, exclusively used T.
    unsafe { p.as_mut() }.ok_or_else(|| null_arg(name))
}

/// An array argument of `n` elements (NULL allowed when `n` is 0).
///
/// # Safety
/// `p` is NULL or points to `n` readable, initialized `T`s valid for `'a`.
unsafe fn arg_slice<'a, T>(p: *const T, n: usize, name: &str) -> Res<&'a [T]> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(invalid(format!("{name} is NULL but its count is {n}")));
    }
    // SAFETY: non-NULL, and the caller guarantees n initialized elements.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

/// Copies `src` into the caller's buffer `dst` of `cap` elements, or fails with
/// `LONE_ERR_BUFFER` (writing the size needed to `n_out` in either case).
///
/// # Safety
/// `dst` is NULL or points to `cap` writable `T`s; `n_out` is NULL or a writable `size_t`.
unsafe fn fill<T: Copy>(
    src: &[T],
    dst: *mut T,
    cap: usize,
    n_out: *mut usize,
    what: &str,
) -> Res<()> {
    // SAFETY: forwarded from the caller.
    let n_out = unsafe { arg_mut(n_out, "n_out") }?;
    if cap > 0 && dst.is_null() {
        return Err(invalid(format!(
            "the output array is NULL but cap is {cap}"
        )));
    }
    *n_out = src.len();
    if src.len() > cap {
        return Err(Failure::new(
            lone_status::LONE_ERR_BUFFER,
            format!(
                "{} {what} do not fit a buffer of {cap}; call again with cap >= {} (written to *n_out)",
                src.len(),
                src.len()
            ),
        ));
    }
    if !src.is_empty() {
        // SAFETY: dst is non-NULL with room for cap >= src.len() elements, and a caller's
        // buffer cannot overlap the library's own vector.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
    }
    Ok(())
}

/// Hands a string to the caller (freed with `lone_string_free`).
fn to_c(s: String, what: &str) -> Res<*mut c_char> {
    CString::new(s).map(CString::into_raw).map_err(|_| {
        invalid(format!(
            "the {what} holds a NUL byte, which a C string cannot carry"
        ))
    })
}

/// Writes `s` to the optional output `out`.
///
/// # Safety
/// `out` is NULL or a writable `char *`.
unsafe fn put_str(out: *mut *mut c_char, s: String, what: &str) -> Res<()> {
    if out.is_null() {
        return Ok(());
    }
    let c = to_c(s, what)?;
    // SAFETY: non-NULL and writable by the caller's guarantee.
    unsafe { *out = c };
    Ok(())
}

/// The caller's callback.
struct Sink {
    f: lone_text_fn,
    user: *mut c_void,
}

impl Sink {
    fn streams(&self) -> bool {
        self.f.is_some()
    }

    /// Gives `piece` to the callback; false when it asks to stop.
    fn emit(&self, piece: &str) -> bool {
        let Some(f) = self.f else { return true };
        if piece.is_empty() {
            return true;
        }
        let mut buf = Vec::with_capacity(piece.len() + 1);
        buf.extend_from_slice(piece.as_bytes());
        buf.push(0);
        // SAFETY: `f` is the caller's callback with the documented signature; `buf` is a
        // NUL-terminated copy of the piece that lives through the call; `user` is the
        // caller's own pointer, passed back untouched.
        unsafe { f(buf.as_ptr().cast(), piece.len(), self.user) }
    }
}

fn cancelled() -> Failure {
    Failure::new(
        lone_status::LONE_ERR_CANCELLED,
        "the callback returned false: generation stopped (what came before is kept)",
    )
}

// ---------------------------------------------------------------------------------------
// Options

fn serve_args(path: Option<&str>, options: Option<&str>) -> Res<ServeArgs> {
    lone_rt::serve::local::serve_args_json(path, options).map_err(invalid)
}

/// A JSON object argument (NULL: an empty object).
fn json_object(s: Option<&str>, name: &str) -> Res<Map<String, Value>> {
    match s.map(serde_json::from_str::<Value>) {
        None | Some(Ok(Value::Null)) => Ok(Map::new()),
        Some(Ok(Value::Object(m))) => Ok(m),
        Some(Ok(v)) => Err(invalid(format!("{name} must be a JSON object, not {v}"))),
        Some(Err(e)) => Err(invalid(format!("{name} is not valid JSON: {e}"))),
    }
}

/// Waits for the request's next step (the engine answers or fails; no timeout).
fn next_step(req: &mut Request) -> Res<Step> {
    loop {
        match req.next(Duration::from_secs(1))? {
            Step::Wait => continue,
            s => return Ok(s),
        }
    }
}

// ---------------------------------------------------------------------------------------
// The API

/// The library's version, e.g. "0.1.0" (a static string: do not free it).
#[no_mangle]
pub extern "C" fn lone_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// What the last failed call on this thread said was wrong ("" when the last call
/// succeeded). The string belongs to the library and stays valid until the next call into
/// the library on this thread.
#[no_mangle]
pub extern "C" fn lone_last_error() -> *const c_char {
    LAST_ERROR
        .try_with(|e| e.borrow().as_ptr())
        .unwrap_or(c"".as_ptr())
}

/// Loads a model and starts its engine.
///
/// `path`: a GGUF file or a Hugging Face checkpoint directory; NULL for the default model
/// (SmolLM2-135M-Instruct Q4_1 in ~/.cache/lone/models/, fetched by lone's setup step).
/// `options_json`: NULL or a JSON object with any of
///   "threads" (matrix worker threads; default: the CPU's cores),
///   "ctx" (positions per sequence, prompt + completion; default: the model's, capped at 4096),
///   "parallel" (sequences decoded together, each with its own cache; default 4),
///   "mode" ("auto", "exact" or "fast"), "cache_type" ("f16", "f32" or "q8_0"),
///   "chat_template_file" (a Jinja file to use instead of the model's template),
///   "cache_ram" (MiB for finished prompts' snapshots; 0: off), and
///   "log_format" ("off", the default, "text" or "json": request log lines on stderr).
/// An unknown key is LONE_ERR_INVALID. On success `*out` is the model; on failure NULL
/// (LONE_ERR_LOAD when the model cannot be loaded).
///
/// # Safety
/// `path` and `options_json` are NULL or NUL-terminated strings; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn lone_model_open(
    path: *const c_char,
    options_json: *const c_char,
    out: *mut *mut lone_model,
) -> lone_status {
    guard(|| {
        // SAFETY: the caller passes a writable `lone_model **` (checked for NULL).
        let out = unsafe { arg_mut(out, "out") }?;
        *out = std::ptr::null_mut();
        // SAFETY: the caller passes NULL or NUL-terminated strings.
        let (path, options) = unsafe {
            (
                opt_str(path, "path")?,
                opt_str(options_json, "options_json")?,
            )
        };
        let args = serve_args(path, options)?;
        let local =
            Local::open(&args).map_err(|e| Failure::new(lone_status::LONE_ERR_LOAD, report(&e)))?;
        *out = Box::into_raw(Box::new(lone_model {
            local: Arc::new(local),
        }));
        Ok(())
    })
}

/// Releases the caller's reference to a model (NULL is ignored). The model is unloaded when
/// its last sequence is freed too.
///
/// # Safety
/// `model` is NULL or a model from `lone_model_open`, not freed before and not in use by
/// another thread.
#[no_mangle]
pub unsafe extern "C" fn lone_model_free(model: *mut lone_model) {
    guard_void(|| {
        if !model.is_null() {
            // SAFETY: the caller passes a pointer from Box::into_raw in lone_model_open,
            // freed once.
            drop(unsafe { Box::from_raw(model) });
        }
    })
}

/// The model's description as JSON: id, path, architecture, quantization, parameters,
/// context, vocab_size, embedding_size, chat_template (whether it has one). Free
/// `*out_json` with `lone_string_free`.
///
/// # Safety
/// `model` is a live model; `out_json` is writable.
#[no_mangle]
pub unsafe extern "C" fn lone_model_info(
    model: *const lone_model,
    out_json: *mut *mut c_char,
) -> lone_status {
    guard(|| {
        // SAFETY: the caller passes a live model and a writable `char **`.
        let (m, out) = unsafe { (arg(model, "model")?, arg_mut(out_json, "out_json")?) };
        *out = to_c(m.local.info().to_string(), "model info")?;
        Ok(())
    })
}

/// Frees a string the library returned (NULL is ignored).
///
/// # Safety
/// `s` is NULL or a string from this library, not freed before.
#[no_mangle]
pub unsafe extern "C" fn lone_string_free(s: *mut c_char) {
    guard_void(|| {
        if !s.is_null() {
            // SAFETY: the caller passes a pointer from CString::into_raw, freed once.
            drop(unsafe { CString::from_raw(s) });
        }
    })
}

/// The token ids of `text`, with the tokenizer's special tokens (BOS) when `add_special`.
/// `*n_out` is set to the number of ids; they are written to `ids` when they fit its `cap`
/// elements, else LONE_ERR_BUFFER and `ids` is untouched (call with `cap` 0 and `ids` NULL
/// to learn the count).
///
/// # Safety
/// `model` is a live model; `text` is a NUL-terminated string; `ids` is NULL or has room
/// for `cap` ids; `n_out` is writable.
#[no_mangle]
pub unsafe extern "C" fn lone_tokenize(
    model: *const lone_model,
    text: *const c_char,
    add_special: bool,
    ids: *mut u32,
    cap: usize,
    n_out: *mut usize,
) -> lone_status {
    guard(|| {
        // SAFETY: the caller passes a live model and a NUL-terminated string.
        let (m, text) = unsafe { (arg(model, "model")?, req_str(text, "text")?) };
        if n_out.is_null() {
            return Err(null_arg("n_out"));
        }
        let toks = m.local.tokenize(text, add_special)?;
        // SAFETY: the caller passes `ids` with room for `cap` ids and a writable `n_out`.
        unsafe { fill(&toks, ids, cap, n_out, "tokens") }
    })
}

/// The text of `n` token ids (special tokens included as text). Free `*out_text` with
/// `lone_string_free`.
///
/// # Safety
/// `model` is a live model; `ids` points to `n` ids (NULL when `n` is 0); `out_text` is
/// writable.
#[no_mangle]
pub unsafe extern "C" fn lone_detokenize(
    model: *const lone_model,
    ids: *const u32,
    n: usize,
    out_text: *mut *mut c_char,
) -> lone_status {
    guard(|| {
        // SAFETY: the caller passes a live model, `n` readable ids and a writable `char **`.
        let (m, ids, out) = unsafe {
            (
                arg(model, "model")?,
                arg_slice(ids, n, "ids")?,
                arg_mut(out_text, "out_text")?,
            )
        };
        let text = m.local.detokenize(ids)?;
        *out = to_c(text, "text")?;
        Ok(())
    })
}

/// A new, empty sequence on `model`. It holds a reference to the model (which stays loaded
/// until the sequence is freed too). Free it with `lone_seq_free`.
///
/// # Safety
/// `model` is a live model; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn lone_seq_new(
    model: *const lone_model,
    out: *mut *mut lone_seq,
) -> lone_status {
    guard(|| {
        // SAFETY: the caller passes a live model and a writable `lone_seq **`.
        let (m, out) = unsafe { (arg(model, "model")?, arg_mut(out, "out")?) };
        *out = Box::into_raw(Box::new(lone_seq {
            local: m.local.clone(),
            ids: Vec::new(),
        }));
        Ok(())
    })
}

/// Appends `n` token ids to the sequence (each must be below the model's vocab_size; else
/// LONE_ERR_INVALID and nothing is appended).
///
/// # Safety
/// `seq` is a live sequence used by no other thread meanwhile; `ids` points to `n` ids
/// (NULL when `n` is 0).
#[no_mangle]
pub unsafe extern "C" fn lone_seq_feed(
    seq: *mut lone_seq,
    ids: *const u32,
    n: usize,
) -> lone_status {
    guard(|| {
        // SAFETY: the caller passes a live sequence used only here and `n` readable ids.
        let (s, ids) = unsafe { (arg_mut(seq, "seq")?, arg_slice(ids, n, "ids")?) };
        let vocab = s.local.vocab();
        if let Some((i, bad)) = ids.iter().enumerate().find(|(_, &t)| t as usize >= vocab) {
            return Err(invalid(format!(
                "ids[{i}] = {bad} is out of the vocabulary (size {vocab}); nothing was appended"
            )));
        }
        s.ids.extend_from_slice(ids);
        Ok(())
    })
}

/// Tokenizes `text` without special tokens and appends its ids to the sequence.
///
/// # Safety
/// `seq` is a live sequence used by no other thread meanwhile; `text` is a NUL-terminated
/// string.
#[no_mangle]
pub unsafe extern "C" fn lone_seq_feed_text(
    seq: *mut lone_seq,
    text: *const c_char,
) -> lone_status {
    guard(|| {
        // SAFETY: the caller passes a live sequence used only here and a NUL-terminated string.
        let (s, text) = unsafe { (arg_mut(seq, "seq")?, req_str(text, "text")?) };
        let ids = s.local.tokenize(text, false)?;
        s.ids.extend(ids);
        Ok(())
    })
}

/// Generates a continuation of the sequence and appends its token ids to it.
///
/// The request is a completion (`POST /v1/completions`) whose prompt is the sequence's
/// tokens; `params_json` is NULL or a JSON object with its other fields: "max_tokens",
/// "temperature", "top_k", "top_p", "min_p", "seed", "stop", "repeat_penalty",
/// "presence_penalty", "frequency_penalty", "ignore_eos", "json_schema", "grammar", ...
/// ("prompt", "stream", "stream_options" and "echo" are set by this function; "n" must be 1).
/// With `on_text`, the text is streamed to it as it is decoded; returning false stops
/// generation (LONE_ERR_CANCELLED, keeping the tokens generated so far). `*out_text`
/// (when `out_text` is not NULL) receives the whole generated text; free it with
/// `lone_string_free`. The ids appended are the ones generated, a stop string's included
/// (its text is not in `*out_text`); the end-of-sequence token that ended generation is not
/// included. The engine keeps the
/// sequence's cache, so the next call on the grown sequence does not prefill it again.
///
/// # Safety
/// `seq` is a live sequence used by no other thread meanwhile; `params_json` is NULL or a
/// NUL-terminated string; `on_text` is NULL or a function as `lone_text_fn` describes;
/// `out_text` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lone_seq_generate(
    seq: *mut lone_seq,
    params_json: *const c_char,
    on_text: lone_text_fn,
    user: *mut c_void,
    out_text: *mut *mut c_char,
) -> lone_status {
    guard(|| {
        // SAFETY: the caller passes a live sequence used only here and NULL or a
        // NUL-terminated string.
        let (s, params) = unsafe { (arg_mut(seq, "seq")?, opt_str(params_json, "params_json")?) };
        let sink = Sink { f: on_text, user };
        let mut body = json_object(params, "params_json")?;
        for k in ["prompt", "stream", "stream_options", "echo"] {
            if body.contains_key(k) {
                return Err(invalid(format!(
                    "params_json sets \"{k}\", which lone_seq_generate sets itself (the prompt is the sequence's tokens; streaming is on when on_text is given); remove it"
                )));
            }
        }
        if let Some(n) = body.get("n").filter(|n| n.as_u64() != Some(1)) {
            return Err(invalid(format!(
                "params_json sets \"n\" to {n}; a sequence continues with one choice, so n must be 1"
            )));
        }
        if s.ids.is_empty() {
            return Err(invalid(
                "the sequence is empty; feed it tokens (lone_seq_feed, lone_seq_feed_text) before generating",
            ));
        }
        body.insert("prompt".into(), json!(s.ids));
        if sink.streams() {
            body.insert("stream".into(), json!(true));
        }
        let mut req = s.local.request(Kind::Completion, &Value::Object(body))?;
        let mut text = String::new();
        let mut stopped = false;
        loop {
            match next_step(&mut req)? {
                Step::Wait | Step::End => break,
                Step::Chunk(c) => {
                    let piece = c["choices"][0]["text"].as_str().unwrap_or("");
                    text.push_str(piece);
                    if !sink.emit(piece) {
                        stopped = true;
                        break;
                    }
                }
                Step::Response(r) => {
                    text = r["choices"][0]["text"].as_str().unwrap_or("").to_string();
                    break;
                }
            }
        }
        let new_ids = req.token_ids(0).to_vec();
        drop(req);
        s.ids.extend(new_ids);
        // SAFETY: the caller passes NULL or a writable `char **`.
        unsafe { put_str(out_text, text, "generated text") }?;
        if stopped {
            return Err(cancelled());
        }
        Ok(())
    })
}

/// The sequence's token ids: `*ids` points to `*n` ids owned by the sequence, valid until
/// it is next fed, generated on or freed.
///
/// # Safety
/// `seq` is a live sequence; `ids` and `n` are writable.
#[no_mangle]
pub unsafe extern "C" fn lone_seq_tokens(
    seq: *const lone_seq,
    ids: *mut *const u32,
    n: *mut usize,
) -> lone_status {
    guard(|| {
        // SAFETY: the caller passes a live sequence and writable outputs.
        let (s, ids, n) = unsafe { (arg(seq, "seq")?, arg_mut(ids, "ids")?, arg_mut(n, "n")?) };
        *ids = s.ids.as_ptr();
        *n = s.ids.len();
        Ok(())
    })
}

/// Frees a sequence (NULL is ignored); its model is unloaded if it was the last reference.
///
/// # Safety
/// `seq` is NULL or a sequence from `lone_seq_new`, not freed before and not in use.
#[no_mangle]
pub unsafe extern "C" fn lone_seq_free(seq: *mut lone_seq) {
    guard_void(|| {
        if !seq.is_null() {
            // SAFETY: the caller passes a pointer from Box::into_raw in lone_seq_new, freed
            // once.
            drop(unsafe { Box::from_raw(seq) });
        }
    })
}

/// One chat choice assembled from streamed chunks.
#[derive(Default)]
struct ChatChoice {
    content: String,
    reasoning: Option<String>,
    calls: Vec<Value>,
    logprobs: Option<Vec<Value>>,
    finish: Value,
}

impl ChatChoice {
    /// Adds one chunk's choice (its `delta`, `logprobs`, `finish_reason`); returns the
    /// content it added.
    fn add(&mut self, c: &Value) -> String {
        let d = &c["delta"];
        let content = d["content"].as_str().unwrap_or("").to_string();
        self.content.push_str(&content);
        if let Some(r) = d["reasoning_content"].as_str() {
            self.reasoning.get_or_insert_with(String::new).push_str(r);
        }
        for tc in d["tool_calls"].as_array().into_iter().flatten() {
            let i = tc["index"].as_u64().unwrap_or(0) as usize;
            if i >= self.calls.len() {
                self.calls.resize(
                    i + 1,
                    json!({"id": "", "type": "function", "function": {"name": "", "arguments": ""}}),
                );
            }
            let call = &mut self.calls[i];
            for k in ["id", "type"] {
                if let Some(v) = tc[k].as_str() {
                    call[k] = json!(v);
                }
            }
            if let Some(n) = tc["function"]["name"].as_str() {
                call["function"]["name"] = json!(n);
            }
            if let Some(a) = tc["function"]["arguments"].as_str() {
                let mut s = call["function"]["arguments"]
                    .as_str()
                    .unwrap_or("")
                    .to_string();
                s.push_str(a);
                call["function"]["arguments"] = json!(s);
            }
        }
        if let Some(lp) = c["logprobs"]["content"].as_array() {
            self.logprobs
                .get_or_insert_with(Vec::new)
                .extend(lp.iter().cloned());
        }
        if !c["finish_reason"].is_null() {
            self.finish = c["finish_reason"].clone();
        }
        content
    }

    fn json(self, index: usize) -> Value {
        let mut m = Map::new();
        m.insert("role".into(), json!("assistant"));
        let content = if self.content.is_empty() && !self.calls.is_empty() {
            Value::Null
        } else {
            json!(self.content)
        };
        m.insert("content".into(), content);
        if let Some(r) = self.reasoning {
            m.insert("reasoning_content".into(), json!(r));
        }
        if !self.calls.is_empty() {
            m.insert("tool_calls".into(), Value::Array(self.calls));
        }
        json!({
            "index": index,
            "message": m,
            "logprobs": self.logprobs.map_or(Value::Null, |c| json!({"content": c})),
            "finish_reason": self.finish,
        })
    }
}

/// Runs a chat completion (`POST /v1/chat/completions`).
///
/// `request_json` is its body: "messages", and optionally "tools", "tool_choice",
/// "response_format", "max_tokens", "temperature", "seed", "stop", ... ("stream" and
/// "stream_options" are set by this function). With `on_content`, the reply's content is
/// streamed to it as it is decoded (tool calls and reasoning are not; they are in the
/// response), and "n" must be 1; returning false stops generation (LONE_ERR_CANCELLED,
/// with the response so far and a null finish_reason). `*out_response_json` (when
/// `out_response_json` is not NULL) receives the OpenAI `chat.completion` object
/// (assembled from the streamed chunks when streaming: content, reasoning_content,
/// tool_calls, finish_reason, usage); free it with `lone_string_free`.
///
/// # Safety
/// `model` is a live model; `request_json` is a NUL-terminated string; `on_content` is NULL
/// or a function as `lone_text_fn` describes; `out_response_json` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lone_chat(
    model: *const lone_model,
    request_json: *const c_char,
    on_content: lone_text_fn,
    user: *mut c_void,
    out_response_json: *mut *mut c_char,
) -> lone_status {
    guard(|| {
        // SAFETY: the caller passes a live model and a NUL-terminated string.
        let (m, body) = unsafe { (arg(model, "model")?, req_str(request_json, "request_json")?) };
        let sink = Sink {
            f: on_content,
            user,
        };
        let mut body = json_object(Some(body), "request_json")?;
        for k in ["stream", "stream_options"] {
            if body.contains_key(k) {
                return Err(invalid(format!(
                    "request_json sets \"{k}\", which lone_chat sets itself (streaming is on when on_content is given); remove it"
                )));
            }
        }
        if sink.streams() {
            if let Some(n) = body.get("n").filter(|n| n.as_u64() != Some(1)) {
                return Err(invalid(format!(
                    "request_json sets \"n\" to {n}; with on_content, n must be 1 (or pass NULL on_content for several choices)"
                )));
            }
            body.insert("stream".into(), json!(true));
            body.insert("stream_options".into(), json!({"include_usage": true}));
        }
        let mut req = m.local.request(Kind::Chat, &Value::Object(body))?;
        let mut head = Map::new();
        let mut choice = ChatChoice::default();
        let mut usage = Value::Null;
        let mut stopped = false;
        let response = loop {
            match next_step(&mut req)? {
                Step::Response(r) => break r,
                Step::Wait | Step::End => {
                    break assemble(head, choice, usage);
                }
                Step::Chunk(c) => {
                    if head.is_empty() {
                        for k in ["id", "created", "model", "system_fingerprint"] {
                            head.insert(k.into(), c[k].clone());
                        }
                    }
                    if !c["usage"].is_null() {
                        usage = c["usage"].clone();
                    }
                    let mut go = true;
                    for ch in c["choices"].as_array().into_iter().flatten() {
                        let piece = choice.add(ch);
                        go = go && sink.emit(&piece);
                    }
                    if !go {
                        stopped = true;
                        break assemble(head, choice, usage);
                    }
                }
            }
        };
        drop(req);
        // SAFETY: the caller passes NULL or a writable `char **`.
        unsafe { put_str(out_response_json, response.to_string(), "response") }?;
        if stopped {
            return Err(cancelled());
        }
        Ok(())
    })
}

/// The `chat.completion` object from a stream's first chunk's fields and its one choice.
fn assemble(head: Map<String, Value>, choice: ChatChoice, usage: Value) -> Value {
    let mut r = json!({
        "id": head.get("id").cloned().unwrap_or(Value::Null),
        "object": "chat.completion",
        "created": head.get("created").cloned().unwrap_or(Value::Null),
        "model": head.get("model").cloned().unwrap_or(Value::Null),
        "system_fingerprint": head.get("system_fingerprint").cloned().unwrap_or(Value::Null),
        "choices": [choice.json(0)],
    });
    if !usage.is_null() {
        r["usage"] = usage;
    }
    r
}

/// The embedding of `text` (as `POST /v1/embeddings` computes it): `*n_out` is set to its
/// size (the model's embedding_size); the floats are written to `out` when they fit its
/// `cap` elements, else LONE_ERR_BUFFER and `out` is untouched.
///
/// # Safety
/// `model` is a live model; `text` is a NUL-terminated string; `out` is NULL or has room
/// for `cap` floats; `n_out` is writable.
#[no_mangle]
pub unsafe extern "C" fn lone_embed(
    model: *const lone_model,
    text: *const c_char,
    out: *mut f32,
    cap: usize,
    n_out: *mut usize,
) -> lone_status {
    guard(|| {
        // SAFETY: the caller passes a live model and a NUL-terminated string.
        let (m, text) = unsafe { (arg(model, "model")?, req_str(text, "text")?) };
        if n_out.is_null() {
            return Err(null_arg("n_out"));
        }
        let r = m.local.embeddings(&json!({"input": text}))?;
        let v: Vec<f32> = r["data"][0]["embedding"]
            .as_array()
            .ok_or_else(|| {
                Failure::new(
                    lone_status::LONE_ERR_RUNTIME,
                    "the embeddings response has no data[0].embedding",
                )
            })?
            .iter()
            .map(|x| x.as_f64().unwrap_or(f64::NAN) as f32)
            .collect();
        // SAFETY: the caller passes `out` with room for `cap` floats and a writable `n_out`.
        unsafe { fill(&v, out, cap, n_out, "floats") }
    })
}

#[cfg(test)]
mod tests;
