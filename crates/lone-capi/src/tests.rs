//! The C functions called from Rust (unit tests: the crate is a cdylib and staticlib only): argument checks, error messages,
//! buffers, callbacks, sequences and several models, on the default model.

use std::ffi::{c_char, c_void, CStr, CString};
use std::path::Path;
use std::ptr::{null, null_mut};

use super::*;
use serde_json::Value;

const OPTS: &CStr = c"{\"threads\": 2, \"parallel\": 2}";

fn model_path() -> CString {
    let home = std::env::var("HOME").expect("HOME is not set");
    let p = Path::new(&home).join(".cache/lone/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.is_file(),
        "{} is missing: run scripts/fetch-default-model.sh",
        p.display()
    );
    CString::new(p.to_str().unwrap()).unwrap()
}

fn last_error() -> String {
    // SAFETY: lone_last_error returns a NUL-terminated string valid until the next call.
    unsafe { CStr::from_ptr(lone_last_error()) }
        .to_str()
        .unwrap()
        .to_string()
}

/// Takes a string the library returned.
fn take(s: *mut c_char) -> String {
    assert!(!s.is_null());
    // SAFETY: a NUL-terminated string from the library, freed once here.
    let out = unsafe { CStr::from_ptr(s) }.to_str().unwrap().to_string();
    unsafe { lone_string_free(s) };
    out
}

struct Model(*mut lone_model);

impl Model {
    fn open() -> Model {
        let path = model_path();
        let mut m = null_mut();
        let st = unsafe { lone_model_open(path.as_ptr(), OPTS.as_ptr(), &mut m) };
        assert_eq!(st, lone_status::LONE_OK, "{}", last_error());
        assert!(!m.is_null());
        Model(m)
    }

    fn tokenize(&self, text: &str) -> Vec<u32> {
        let t = CString::new(text).unwrap();
        let mut ids = vec![0u32; 256];
        let mut n = 0;
        let st = unsafe { lone_tokenize(self.0, t.as_ptr(), false, ids.as_mut_ptr(), 256, &mut n) };
        assert_eq!(st, lone_status::LONE_OK, "{}", last_error());
        ids.truncate(n);
        ids
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        unsafe { lone_model_free(self.0) };
    }
}

struct Seq(*mut lone_seq);

impl Seq {
    fn new(m: &Model, ids: &[u32]) -> Seq {
        let mut s = null_mut();
        assert_eq!(unsafe { lone_seq_new(m.0, &mut s) }, lone_status::LONE_OK);
        let st = unsafe { lone_seq_feed(s, ids.as_ptr(), ids.len()) };
        assert_eq!(st, lone_status::LONE_OK, "{}", last_error());
        Seq(s)
    }

    fn tokens(&self) -> Vec<u32> {
        let (mut p, mut n) = (null(), 0);
        assert_eq!(
            unsafe { lone_seq_tokens(self.0, &mut p, &mut n) },
            lone_status::LONE_OK
        );
        unsafe { std::slice::from_raw_parts(p, n) }.to_vec()
    }

    fn generate(&mut self, params: &str) -> String {
        let p = CString::new(params).unwrap();
        let mut out = null_mut();
        let st = unsafe { lone_seq_generate(self.0, p.as_ptr(), None, null_mut(), &mut out) };
        assert_eq!(st, lone_status::LONE_OK, "{}", last_error());
        take(out)
    }
}

impl Drop for Seq {
    fn drop(&mut self) {
        unsafe { lone_seq_free(self.0) };
    }
}

fn open_err(path: Option<&str>, opts: &str) -> (lone_status, String) {
    let p = path.map(|p| CString::new(p).unwrap());
    let o = CString::new(opts).unwrap();
    let mut m = null_mut();
    let st = unsafe {
        lone_model_open(
            p.as_ref().map_or(null(), |p| p.as_ptr()),
            o.as_ptr(),
            &mut m,
        )
    };
    assert!(m.is_null());
    (st, last_error())
}

#[test]
fn bad_options_are_invalid_and_say_why() {
    let path = model_path();
    let path = path.to_str().unwrap();
    for (opts, needle) in [
        ("{\"threads\": 2, \"colour\": 1}", "\"colour\""),
        ("{\"threads\": \"two\"}", "\"threads\""),
        ("{\"ctx\": 0}", "\"ctx\""),
        ("{\"mode\": \"slow\"}", "\"slow\""),
        ("{\"cache_type\": \"q3\"}", "cache_type"),
        ("{\"threads\": 2", "not valid JSON"),
        ("[1, 2]", "JSON object"),
    ] {
        let (st, msg) = open_err(Some(path), opts);
        assert_eq!(st, lone_status::LONE_ERR_INVALID, "{opts}: {msg}");
        assert!(
            msg.contains(needle),
            "{opts}: {msg:?} does not mention {needle}"
        );
    }
    let (st, msg) = open_err(Some("/no/such/model.gguf"), "{}");
    assert_eq!(st, lone_status::LONE_ERR_LOAD);
    assert!(msg.contains("/no/such/model.gguf"), "{msg}");
}

#[test]
fn null_pointers_and_bad_utf8_are_invalid() {
    let m = Model::open();
    let mut n = 0usize;
    let text = c"hello";
    // Each call's status, and its message (the last error is the last call's).
    macro_rules! check {
        ($call:expr, $needle:expr) => {{
            let st = unsafe { $call };
            assert_eq!(st, lone_status::LONE_ERR_INVALID, "{}", stringify!($call));
            let msg = last_error();
            assert!(msg.contains($needle), "{}: {msg:?}", stringify!($call));
        }};
    }
    check!(lone_model_open(null(), null(), null_mut()), "out is NULL");
    check!(
        lone_tokenize(null(), text.as_ptr(), false, null_mut(), 0, &mut n),
        "model is NULL"
    );
    check!(
        lone_tokenize(m.0, text.as_ptr(), false, null_mut(), 0, null_mut()),
        "n_out is NULL"
    );
    check!(
        lone_tokenize(m.0, text.as_ptr(), false, null_mut(), 4, &mut n),
        "cap is 4"
    );
    check!(
        lone_detokenize(m.0, null(), 3, &mut null_mut()),
        "ids is NULL"
    );
    check!(lone_model_info(m.0, null_mut()), "out_json is NULL");
    check!(lone_seq_new(m.0, null_mut()), "out is NULL");
    check!(lone_seq_feed(null_mut(), null(), 0), "seq is NULL");
    check!(
        lone_seq_generate(null_mut(), null(), None, null_mut(), null_mut()),
        "seq is NULL"
    );
    check!(
        lone_chat(m.0, null(), None, null_mut(), null_mut()),
        "request_json is NULL"
    );
    // Messages, one call at a time.
    let st = unsafe { lone_tokenize(m.0, null(), false, null_mut(), 0, &mut n) };
    assert_eq!(st, lone_status::LONE_ERR_INVALID);
    assert_eq!(last_error(), "text is NULL; pass a valid pointer");
    let bad = [0x66u8, 0xff, 0xfe, 0];
    let st = unsafe { lone_tokenize(m.0, bad.as_ptr().cast(), false, null_mut(), 0, &mut n) };
    assert_eq!(st, lone_status::LONE_ERR_INVALID);
    assert!(last_error().contains("not valid UTF-8"), "{}", last_error());
    // A success clears the message.
    let mut info = null_mut();
    assert_eq!(
        unsafe { lone_model_info(m.0, &mut info) },
        lone_status::LONE_OK
    );
    assert_eq!(last_error(), "");
    let info: Value = serde_json::from_str(&take(info)).unwrap();
    assert_eq!(info["vocab_size"], 49152);
    // Freeing NULL is fine.
    unsafe {
        lone_model_free(null_mut());
        lone_seq_free(null_mut());
        lone_string_free(null_mut());
    }
}

#[test]
fn small_buffers_report_the_size_needed() {
    let m = Model::open();
    let text = c"The quick brown fox jumps over the lazy dog.";
    let mut n = 0usize;
    let st = unsafe { lone_tokenize(m.0, text.as_ptr(), false, null_mut(), 0, &mut n) };
    assert_eq!(st, lone_status::LONE_ERR_BUFFER);
    let need = n;
    assert!(need > 3);
    assert!(
        last_error().contains(&format!("cap >= {need}")),
        "{}",
        last_error()
    );
    let mut ids = [u32::MAX; 3];
    let st = unsafe { lone_tokenize(m.0, text.as_ptr(), false, ids.as_mut_ptr(), 3, &mut n) };
    assert_eq!(st, lone_status::LONE_ERR_BUFFER);
    assert_eq!(n, need);
    assert_eq!(ids, [u32::MAX; 3], "a too-small buffer was written to");
    let mut ids = vec![0u32; need];
    let st = unsafe { lone_tokenize(m.0, text.as_ptr(), false, ids.as_mut_ptr(), need, &mut n) };
    assert_eq!(st, lone_status::LONE_OK);
    let mut out = null_mut();
    let st = unsafe { lone_detokenize(m.0, ids.as_ptr(), n, &mut out) };
    assert_eq!(st, lone_status::LONE_OK);
    assert_eq!(take(out), text.to_str().unwrap());

    // Embeddings: the same protocol, the model's width.
    let mut n = 0usize;
    let st = unsafe { lone_embed(m.0, text.as_ptr(), null_mut(), 0, &mut n) };
    assert_eq!(st, lone_status::LONE_ERR_BUFFER, "{}", last_error());
    assert_eq!(n, 576);
    let mut v = vec![f32::NAN; n];
    let st = unsafe { lone_embed(m.0, text.as_ptr(), v.as_mut_ptr(), n, &mut n) };
    assert_eq!(st, lone_status::LONE_OK, "{}", last_error());
    assert!(v.iter().all(|x| x.is_finite()) && v.iter().any(|&x| x != 0.0));
}

#[test]
fn feeding_checks_ids_and_generation_checks_params() {
    let m = Model::open();
    let mut s = Seq::new(&m, &[1, 2, 3]);
    let st = unsafe { lone_seq_feed(s.0, [5u32, 49152].as_ptr(), 2) };
    assert_eq!(st, lone_status::LONE_ERR_INVALID);
    assert!(last_error().contains("ids[1] = 49152"), "{}", last_error());
    assert_eq!(s.tokens(), [1, 2, 3], "a rejected feed appended ids");
    for (p, needle) in [
        ("{\"prompt\": \"x\"}", "\"prompt\""),
        ("{\"n\": 2}", "\"n\""),
        ("{\"temperature\": \"hot\"}", "temperature"),
        ("{\"max_tokens\": 4", "not valid JSON"),
    ] {
        let c = CString::new(p).unwrap();
        let st = unsafe { lone_seq_generate(s.0, c.as_ptr(), None, null_mut(), null_mut()) };
        assert_eq!(st, lone_status::LONE_ERR_INVALID, "{p}");
        assert!(last_error().contains(needle), "{p}: {}", last_error());
    }
    assert_eq!(s.tokens(), [1, 2, 3]);
    let mut empty = Seq::new(&m, &[]);
    let st = unsafe { lone_seq_generate(empty.0, null(), None, null_mut(), null_mut()) };
    assert_eq!(st, lone_status::LONE_ERR_INVALID);
    assert!(last_error().contains("empty"), "{}", last_error());
    // feed_text appends the text's ids without special tokens.
    let text = c" Paris";
    assert_eq!(
        unsafe { lone_seq_feed_text(empty.0, text.as_ptr()) },
        lone_status::LONE_OK
    );
    assert_eq!(empty.tokens(), m.tokenize(" Paris"));
    let _ = empty.generate("{\"max_tokens\": 2, \"temperature\": 0}");
    let _ = s.generate("{\"max_tokens\": 2, \"temperature\": 0}");
}

#[test]
fn a_sequence_continues_as_one_generation() {
    let m = Model::open();
    let prompt = m.tokenize("Once upon a time, in a small village,");
    let params = |n| format!("{{\"max_tokens\": {n}, \"temperature\": 0, \"ignore_eos\": true}}");
    let mut whole = Seq::new(&m, &prompt);
    let all = whole.generate(&params(16));
    let mut parts = Seq::new(&m, &prompt);
    let a = parts.generate(&params(8));
    assert_eq!(parts.tokens().len(), prompt.len() + 8);
    let b = parts.generate(&params(8));
    assert_eq!(parts.tokens(), whole.tokens());
    // The text of the parts may split a character differently; the ids may not.
    assert_eq!(format!("{a}{b}"), all);
}

struct Count {
    calls: usize,
    stop_after: usize,
    text: String,
}

impl Count {
    /// A callback state that asks to stop after `stop_after` pieces.
    fn new(stop_after: usize) -> Count {
        Count {
            calls: 0,
            stop_after,
            text: String::new(),
        }
    }
}

/// `lone_chat` with `req`, streaming into `count` when given: its status and response.
fn chat(m: &Model, req: &CStr, count: Option<&mut Count>) -> (lone_status, Value) {
    let (cb, user): (lone_text_fn, *mut c_void) = match count {
        Some(c) => (Some(collect), (c as *mut Count).cast()),
        None => (None, null_mut()),
    };
    let mut out = null_mut();
    let st = unsafe { lone_chat(m.0, req.as_ptr(), cb, user, &mut out) };
    let v = if out.is_null() {
        Value::Null
    } else {
        serde_json::from_str(&take(out)).unwrap()
    };
    (st, v)
}

/// `lone_seq_generate` on `s` with `params`, streaming into `count`: its status and text.
fn generate_into(s: &Seq, params: &CStr, count: &mut Count) -> (lone_status, String) {
    let mut out = null_mut();
    let st = unsafe {
        lone_seq_generate(
            s.0,
            params.as_ptr(),
            Some(collect),
            (count as *mut Count).cast(),
            &mut out,
        )
    };
    let text = if out.is_null() {
        String::new()
    } else {
        take(out)
    };
    (st, text)
}

unsafe extern "C" fn collect(piece: *const c_char, len: usize, user: *mut c_void) -> bool {
    // SAFETY: `user` is the &mut Count the test passed; piece has len bytes.
    let c = unsafe { &mut *(user as *mut Count) };
    let bytes = unsafe { std::slice::from_raw_parts(piece.cast::<u8>(), len) };
    assert_eq!(
        unsafe { *piece.add(len) },
        0,
        "the piece is not NUL-terminated"
    );
    c.text.push_str(std::str::from_utf8(bytes).unwrap());
    c.calls += 1;
    c.calls < c.stop_after
}

#[test]
fn a_callback_returning_false_stops_generation() {
    let m = Model::open();
    let prompt = m.tokenize("Count: one, two, three,");
    let s = Seq::new(&m, &prompt);
    let mut count = Count::new(2);
    let params = c"{\"max_tokens\": 64, \"temperature\": 0, \"ignore_eos\": true}";
    let (st, out) = generate_into(&s, params, &mut count);
    assert_eq!(st, lone_status::LONE_ERR_CANCELLED, "{}", last_error());
    assert!(last_error().contains("callback"), "{}", last_error());
    assert_eq!(count.calls, 2);
    assert_eq!(out, count.text);
    let added = s.tokens().len() - prompt.len();
    assert!(
        (2..64).contains(&added),
        "{added} tokens kept after the stop"
    );

    // Streaming a whole generation gives the text the plain call gives.
    let a = Seq::new(&m, &prompt);
    let mut b = Seq::new(&m, &prompt);
    let mut count = Count::new(usize::MAX);
    let p = c"{\"max_tokens\": 12, \"temperature\": 0}";
    let (st, _) = generate_into(&a, p, &mut count);
    assert_eq!(st, lone_status::LONE_OK, "{}", last_error());
    assert_eq!(
        count.text,
        b.generate("{\"max_tokens\": 12, \"temperature\": 0}")
    );
    assert_eq!(a.tokens(), b.tokens());

    // A chat stopped by its callback: the response so far, no finish reason.
    let req = c"{\"messages\":[{\"role\":\"user\",\"content\":\"Tell me a long story.\"}],\"max_tokens\":64,\"temperature\":0}";
    let mut count = Count::new(1);
    let (st, r) = chat(&m, req, Some(&mut count));
    assert_eq!(st, lone_status::LONE_ERR_CANCELLED, "{}", last_error());
    assert_eq!(r["choices"][0]["message"]["content"], count.text.as_str());
    assert!(r["choices"][0]["finish_reason"].is_null());
}

#[test]
fn streamed_and_whole_chats_agree() {
    let m = Model::open();
    let req = c"{\"messages\":[{\"role\":\"user\",\"content\":\"What is 2 + 2?\"}],\"max_tokens\":16,\"temperature\":0}";
    let (st, whole) = chat(&m, req, None);
    assert_eq!(st, lone_status::LONE_OK, "{}", last_error());
    let mut count = Count::new(usize::MAX);
    let (st, streamed) = chat(&m, req, Some(&mut count));
    assert_eq!(st, lone_status::LONE_OK, "{}", last_error());
    for r in [&whole, &streamed] {
        assert_eq!(r["object"], "chat.completion");
    }
    assert_eq!(
        streamed["choices"][0]["message"],
        whole["choices"][0]["message"]
    );
    assert_eq!(
        streamed["choices"][0]["finish_reason"],
        whole["choices"][0]["finish_reason"]
    );
    assert_eq!(
        streamed["usage"]["completion_tokens"],
        whole["usage"]["completion_tokens"]
    );
    assert_eq!(
        count.text,
        whole["choices"][0]["message"]["content"].as_str().unwrap()
    );
    // A request the server rejects is LONE_ERR_INVALID with its message.
    let bad = c"{\"messages\": \"hi\"}";
    let st = unsafe { lone_chat(m.0, bad.as_ptr(), None, null_mut(), null_mut()) };
    assert_eq!(st, lone_status::LONE_ERR_INVALID);
    assert!(last_error().contains("messages"), "{}", last_error());
    let bad = c"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}], \"stream\": true}";
    let st = unsafe { lone_chat(m.0, bad.as_ptr(), None, null_mut(), null_mut()) };
    assert_eq!(st, lone_status::LONE_ERR_INVALID);
    assert!(last_error().contains("\"stream\""), "{}", last_error());
}

#[test]
fn two_models_at_once_from_two_threads() {
    let a = Model::open();
    let b = Model::open();
    let prompt = a.tokenize("The best thing about the sea is");
    assert_eq!(prompt, b.tokenize("The best thing about the sea is"));
    let params = "{\"max_tokens\": 12, \"temperature\": 0}";
    // Each thread gets its own sequence (a model is shared across threads; a sequence not).
    struct SendSeq(Seq);
    // SAFETY (test): each sequence is used by exactly one thread.
    unsafe impl Send for SendSeq {}
    let sa = SendSeq(Seq::new(&a, &prompt));
    let sb = SendSeq(Seq::new(&b, &prompt));
    let ta = std::thread::spawn(move || {
        let mut s = sa;
        s.0.generate(params)
    });
    let tb = std::thread::spawn(move || {
        let mut s = sb;
        s.0.generate(params)
    });
    let (ta, tb) = (ta.join().unwrap(), tb.join().unwrap());
    assert!(!ta.is_empty());
    assert_eq!(ta, tb);
    // A sequence keeps its model loaded after the model is freed.
    let mut s = Seq::new(&b, &prompt);
    drop(b);
    assert_eq!(s.generate(params), ta);
}
