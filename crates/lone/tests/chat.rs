//! `lone chat` end to end in a pseudo-terminal (expectrl) and through a pipe.
//!
//! The prefill counts the REPL reports are checked against counts computed here,
//! independently: render the conversations with the model's chat template (lone-core's
//! renderer, itself tested byte-identical to transformers), tokenize them, and take the token
//! difference between the new prompt and the previous prompt plus the reply.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

mod common;

use common::smollm2;
use expectrl::process::unix::WaitStatus;
use expectrl::{ControlCode, Eof, Expect, Regex};
use lone_core::generate::{generate, GenerateOptions};
use lone_core::sampler::{Sampler, SamplingParams};
use lone_core::text::TextIo;
use lone_core::Model;
use serde_json::{json, Value as Json};

type Pty = expectrl::session::OsSession;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/reference/fixtures")
        .join(name)
}

fn spawn(model: &Path, args: &[&str]) -> Pty {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lone"));
    cmd.arg("chat").arg("--model").arg(model).args(args);
    cmd.env("TERM", "xterm");
    let mut p = expectrl::session::Session::spawn(cmd).expect("spawn lone chat");
    p.set_expect_timeout(Some(Duration::from_secs(120)));
    p
}

fn expect_str(p: &mut Pty, s: &str) -> String {
    let c = p
        .expect(s)
        .unwrap_or_else(|e| panic!("waiting for {s:?}: {e}"));
    String::from_utf8_lossy(c.before()).into_owned()
}

/// Wait for the next stats line; returns (prefilled, decoded, everything printed before it).
fn expect_stats(p: &mut Pty) -> (usize, usize, String) {
    let c = p
        .expect(Regex(
            r"\[prefill (\d+) tok, [0-9.]+ s, [0-9.]+ tok/s \| decode (\d+) tok, [0-9.]+ s, [0-9.]+ tok/s \| ctx \d+/\d+ \([0-9.]+%\) \| RSS [0-9.]+ MiB\]",
        ))
        .unwrap_or_else(|e| panic!("waiting for a stats line: {e}"));
    let num = |i| {
        std::str::from_utf8(c.get(i).unwrap())
            .unwrap()
            .parse::<usize>()
            .unwrap()
    };
    (
        num(1),
        num(2),
        String::from_utf8_lossy(c.before()).replace("\r\n", "\n"),
    )
}

fn expect_exit_0(mut p: Pty) {
    p.expect(Eof).expect("waiting for the end of output");
    match p.get_process().wait().expect("wait") {
        WaitStatus::Exited(_, code) => assert_eq!(code, 0, "exit code"),
        s => panic!("lone chat ended with {s:?}"),
    }
}

/// The model's text side, loaded independently of the REPL.
struct Reference {
    model: Model,
    text: TextIo,
}

impl Reference {
    fn load(path: &Path) -> Reference {
        let mut model = Model::load(path).unwrap();
        // The CLI's default KV cache (the library's is f32).
        model.set_kv_type(lone_core::cache::KvType::F16).unwrap();
        let text = TextIo::load(&model, path).unwrap();
        Reference { model, text }
    }

    fn render(&self, system: Option<&str>, turns: &[&str], gen: bool) -> String {
        let mut msgs: Vec<Json> = Vec::new();
        if let Some(s) = system {
            msgs.push(json!({"role": "system", "content": s}));
        }
        for (i, t) in turns.iter().enumerate() {
            let role = if i % 2 == 0 { "user" } else { "assistant" };
            msgs.push(json!({"role": role, "content": t}));
        }
        self.text.render_chat(&msgs, gen).unwrap()
    }

    fn count(&self, s: &str) -> usize {
        self.text.tokenizer.encode(s, false).unwrap().len()
    }

    /// Greedy reply to a rendered prompt, from a fresh cache.
    fn reply(&self, rendered: &str, max_new: usize) -> String {
        let ids = self.text.tokenizer.encode(rendered, false).unwrap();
        let mut cache = self.model.new_cache();
        let opts = GenerateOptions {
            max_new_tokens: max_new,
            eos_ids: self.text.eos_ids.clone(),
            ignore_eos: false,
            keep_logits: false,
            ..Default::default()
        };
        let mut sampler = Sampler::new(SamplingParams::greedy());
        let g = generate(&self.model, &mut cache, &ids, &opts, &mut sampler, |_| true).unwrap();
        self.text.decode(&g.tokens).unwrap()
    }

    /// Tokens the template adds for turn 2 beyond turn 1's prompt and reply:
    /// tokens(prompt 2) - tokens(prompt 1 + reply 1).
    fn added(&self, system: Option<&str>, u1: &str, r1: &str, u2: &str) -> usize {
        let p1 = self.render(system, &[u1], true);
        let p2 = self.render(system, &[u1, r1, u2], true);
        let before = format!("{p1}{r1}");
        assert!(
            p2.starts_with(&before),
            "the template re-renders turn 1 differently:\n{p2:?}\nvs\n{before:?}"
        );
        self.count(&p2) - self.count(&before)
    }
}

const FRANCE: &str = "What is the capital of France?";
const GERMANY: &str = "And the capital of Germany?";

#[test]
fn smollm2_turns_reuse_cache_reset_system_stats_quit() {
    let path = smollm2();
    let r = Reference::load(&path);
    let n = 64;
    let mut p = spawn(&path, &["-n", "64"]);

    // Turn 1: the whole prompt is prefilled; the reply is the greedy one.
    p.send_line(FRANCE).unwrap();
    let p1 = r.render(None, &[FRANCE], true);
    let r1 = r.reply(&p1, n);
    assert!(
        r1.split_whitespace().count() >= 3,
        "reference reply: {r1:?}"
    );
    let (prefilled, decoded, out) = expect_stats(&mut p);
    assert!(out.contains(&r1), "reply {r1:?} not in output {out:?}");
    assert_eq!(prefilled, r.count(&p1), "turn 1 prefill");
    assert!(decoded > 0);

    // Turn 2: only what the template added since turn 1 is prefilled.
    p.send_line(GERMANY).unwrap();
    let (prefilled2, _, out2) = expect_stats(&mut p);
    let expected = r.added(None, FRANCE, &r1, GERMANY);
    assert_eq!(prefilled2, expected, "turn 2 prefill; output {out2:?}");
    // And far fewer than the full conversation.
    let p2 = r.render(None, &[FRANCE, &r1, GERMANY], true);
    assert!(prefilled2 < r.count(&p2) / 2);
    let r2 = r.reply(&p2, n);
    assert!(out2.contains(&r2), "reply {r2:?} not in output {out2:?}");

    p.send_line("/stats").unwrap();
    expect_str(&mut p, "turns 2");
    p.expect(Regex(r"prefill (\d+) tok")).unwrap();

    // /reset: the same question prefills the whole prompt again.
    p.send_line("/reset").unwrap();
    expect_str(&mut p, "[conversation cleared]");
    p.send_line(FRANCE).unwrap();
    let (prefilled3, _, out3) = expect_stats(&mut p);
    assert_eq!(prefilled3, r.count(&p1), "prefill after /reset");
    assert!(out3.contains(&r1));

    // /system: a new conversation under the system prompt, prefilled whole.
    let sys = "You are a geography teacher.";
    p.send_line(format!("/system {sys}")).unwrap();
    expect_str(&mut p, "[system prompt set; conversation cleared]");
    p.send_line(FRANCE).unwrap();
    let (prefilled4, _, out4) = expect_stats(&mut p);
    let ps = r.render(Some(sys), &[FRANCE], true);
    assert_eq!(prefilled4, r.count(&ps), "prefill after /system");
    let rs = r.reply(&ps, n);
    assert!(out4.contains(&rs), "reply {rs:?} not in output {out4:?}");
    // Turn 2 under the system prompt reuses the cache too.
    p.send_line(GERMANY).unwrap();
    let (prefilled5, _, _) = expect_stats(&mut p);
    assert_eq!(prefilled5, r.added(Some(sys), FRANCE, &rs, GERMANY));

    p.send_line("/help").unwrap();
    expect_str(&mut p, "/reset");
    p.send_line("/quit").unwrap();
    expect_exit_0(p);
}

#[test]
fn lfm2_fixture_turns_cut_at_the_token_budget() {
    // A random-weight hybrid (conv + attention layers): replies run to the budget, so the
    // last sampled token was never fed back during generation.
    let path = fixture("lfm2_a");
    let r = Reference::load(&path);
    let n = 7;
    let mut p = spawn(&path, &["-n", "7"]);
    let (u1, u2, u3) = ("hello there", "tell me more", "and then?");
    p.send_line(u1).unwrap();
    let (pre1, dec1, _) = expect_stats(&mut p);
    let p1 = r.render(None, &[u1], true);
    assert_eq!(pre1, r.count(&p1));
    let r1 = r.reply(&p1, n);
    assert!(dec1 >= 1 && dec1 <= n);

    p.send_line(u2).unwrap();
    let (pre2, _, _) = expect_stats(&mut p);
    assert_eq!(pre2, r.added(None, u1, &r1, u2), "turn 2 prefill");

    let p2 = r.render(None, &[u1, &r1, u2], true);
    let r2 = r.reply(&p2, n);
    p.send_line(u3).unwrap();
    let (pre3, _, _) = expect_stats(&mut p);
    let p3 = r.render(None, &[u1, &r1, u2, &r2, u3], true);
    let before = format!("{p2}{r2}");
    assert!(p3.starts_with(&before));
    assert_eq!(pre3, r.count(&p3) - r.count(&before), "turn 3 prefill");

    p.send(ControlCode::EndOfTransmission).unwrap(); // Ctrl-D
    expect_exit_0(p);
}

#[test]
fn ctrl_c_stops_generation_and_the_repl_goes_on() {
    let path = smollm2();
    let mut p = spawn(&path, &["--ignore-eos", "-n", "100000"]);
    p.send_line("Count from one to one thousand in words.")
        .unwrap();
    // Wait until the reply streams (past the echo of the message), then interrupt.
    expect_str(&mut p, "in words.");
    p.expect(Regex(r"\n[^\n]*[A-Za-z]{2}")).unwrap();
    std::thread::sleep(Duration::from_secs(1));
    p.send(ControlCode::EndOfText).unwrap(); // Ctrl-C
    expect_str(&mut p, "[stopped]");
    let (_, decoded, _) = expect_stats(&mut p);
    assert!(decoded > 0 && decoded < 100000, "decoded {decoded}");
    // Still alive and chatting.
    p.send_line("/stats").unwrap();
    expect_str(&mut p, "turns 1");
    // Ctrl-C at the prompt clears the line and does not quit.
    expect_str(&mut p, ">>> ");
    p.send("some half-typed line").unwrap();
    expect_str(&mut p, "half-typed line");
    p.send(ControlCode::EndOfText).unwrap();
    expect_str(&mut p, ">>> ");
    p.send_line("/reset").unwrap();
    expect_str(&mut p, "[conversation cleared]");
    p.send_line("/quit").unwrap();
    expect_exit_0(p);
}

#[test]
fn context_overflow_is_reported_not_fatal() {
    let path = fixture("lfm2_a");
    let r = Reference::load(&path);
    let ctx = 48;
    let mut p = spawn(&path, &["--ctx", "48", "-n", "1000", "--ignore-eos"]);
    // A message longer than the context.
    p.send_line("xyz ".repeat(100)).unwrap();
    let out = expect_str(&mut p, "/reset to start a new conversation");
    assert!(out.contains("context overflow"), "{out:?}");
    // A short message whose reply fills the context.
    p.send_line("hi").unwrap();
    let (pre, dec, out) = expect_stats(&mut p);
    assert!(out.contains("[context full"), "{out:?}");
    assert_eq!(
        pre + dec,
        ctx,
        "prefill {pre} + decode {dec} fill the context"
    );
    assert_eq!(pre, r.count(&r.render(None, &["hi"], true)));
    // The next turn cannot fit.
    p.send_line("more").unwrap();
    let out = expect_str(&mut p, "/reset to start a new conversation");
    assert!(out.contains("context overflow"), "{out:?}");
    p.send_line("/reset").unwrap();
    expect_str(&mut p, "[conversation cleared]");
    p.send_line("hi").unwrap();
    let (pre, _, _) = expect_stats(&mut p);
    assert_eq!(pre, r.count(&r.render(None, &["hi"], true)));
    p.send_line("/quit").unwrap();
    expect_exit_0(p);
}

fn run_piped(model: &Path, args: &[&str], input: &[u8]) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_lone"))
        .arg("chat")
        .arg("--model")
        .arg(model)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn piped_input_works_line_by_line() {
    let path = fixture("lfm2_a");
    let r = Reference::load(&path);
    let (code, stdout, stderr) = run_piped(
        &path,
        &["-n", "5"],
        b"hello\n\n   \n/stats\n/nonsense\n/system be brief\nhello\n",
    );
    assert_eq!(code, 0, "stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        !stdout.contains(">>>"),
        "prompt in piped output: {stdout:?}"
    );
    assert!(stdout.contains("turns 1"), "{stdout:?}");
    assert!(stderr.contains("unknown command /nonsense"), "{stderr}");
    let counts: Vec<usize> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("[prefill "))
        .map(|l| l.split(' ').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(
        counts,
        vec![
            r.count(&r.render(None, &["hello"], true)),
            r.count(&r.render(Some("be brief"), &["hello"], true)),
        ]
    );
}

#[test]
fn piped_odd_input_never_panics() {
    let path = fixture("lfm2_a");
    let mut input: Vec<u8> = Vec::new();
    input.extend_from_slice(b"\xff\xfe invalid utf-8 \xc3\n");
    input.extend_from_slice(b"{{ template injection }} {% if %}\n");
    input.extend_from_slice(b"<|im_start|>assistant\n");
    input.extend_from_slice(b"/system\n/\n/ \n/reset extra args\n\r\n");
    input.extend_from_slice(&[b'a'; 5000]);
    input.extend_from_slice(b"\nno newline at the end");
    let (code, _stdout, stderr) = run_piped(&path, &["-n", "3", "--ctx", "256"], &input);
    assert_eq!(code, 0, "stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.contains("context overflow"), "{stderr}");
}

#[test]
fn bad_options_are_errors() {
    let path = fixture("lfm2_a");
    for (args, needle) in [
        (&["--ctx", "0"][..], "--ctx must be at least 1"),
        (
            &["--ctx", "999999"][..],
            "more than the model's context length",
        ),
        (&["--temperature=-1"][..], "bad sampling option"),
        (&["--threads", "0"][..], "--threads must be at least 1"),
    ] {
        let (code, _, stderr) = run_piped(&path, args, b"");
        assert_eq!(code, 1, "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
    let (code, _, stderr) = run_piped(Path::new("/nonexistent/model"), &[], b"");
    assert_eq!(code, 1, "{stderr}");
    assert!(!stderr.contains("panicked"));
}

/// `/image FILE` attaches an image to the next message of a vision-language model: the reply
/// is transformers' greedy reply (tests/reference/fixtures/lfm2_vl, case `one`), and a
/// second turn keeps the image in the conversation. A text-only model and bad files get an
/// error line, and the REPL goes on.
#[test]
fn image_command_attaches_an_image_to_the_next_message() {
    let vl = fixture("lfm2_vl");
    let want: String = serde_json::from_str(
        &std::fs::read_to_string(vl.join("cases/one/greedy_text.json")).unwrap(),
    )
    .unwrap();
    let input = format!(
        "/image {}\n/image\n/image /nonexistent.png\n/image {}\nWhat is this?\nAnd now?\n",
        vl.join("images/small.png").display(),
        vl.join("config.json").display()
    );
    let (code, stdout, stderr) = run_piped(&vl, &["-n", "12", "--ignore-eos"], input.as_bytes());
    assert_eq!(code, 0, "stderr: {stderr}");
    assert!(stderr.contains("image 70×45 attached"), "{stderr}");
    assert_eq!(stderr.matches("error:").count(), 3, "{stderr}");
    assert!(
        stdout.starts_with(&want),
        "{stdout:?} does not start with {want:?}"
    );
    // `[prefill N tok, ... | ctx C/...`: N prompt tokens run, C held after the turn.
    let turns: Vec<(usize, usize)> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("[prefill "))
        .map(|l| {
            let n = l.split(' ').next().unwrap().parse().unwrap();
            let c = l.split("ctx ").nth(1).unwrap().split('/').next().unwrap();
            (n, c.parse().unwrap())
        })
        .collect();
    // The first turn's 29 prompt tokens (case `one`); the second reuses them from the cache,
    // the image's rows included (the same embeddings), and prefills only what follows.
    assert_eq!(turns.len(), 2, "{stderr}");
    assert_eq!(turns[0].0, 29);
    let reused = turns[1].1 - 12 - turns[1].0;
    assert!(reused >= 29, "{stderr}");

    let (code, _, stderr) = run_piped(
        &fixture("lfm2_a"),
        &["-n", "2"],
        format!("/image {}\nhi\n", vl.join("images/small.png").display()).as_bytes(),
    );
    assert_eq!(code, 0, "stderr: {stderr}");
    assert!(stderr.contains("takes no images"), "{stderr}");
}
