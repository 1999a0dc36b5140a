//! The shell examples of the documentation, run as a newcomer pastes them: every ```console
//! block of a file, in order, in one bash session against a fresh server, each command's output
//! (stdout and stderr together, as a terminal shows them) compared with the lines under it. The
//! tutorial goes on from the README's quick start, so it runs after it in the same session.
//!
//! A runner of its own rather than trycmd: trycmd runs one program per line without a shell, so
//! the docs could not pipe a body into `snapshot put`, show `echo $?`, `export` an API key made
//! by `keys create`, call `curl` or `sleep`, and would have to print placeholders such as
//! `[..]` where a reader should see real answers.
//!
//! What differs between two runs on a fresh server is masked on both sides before comparing:
//! times, request ids, client ports, process ids, API key secrets, retry pauses, the time left
//! of a `--wait`. Tokens, versions and audit ids are compared as written: a fresh server hands
//! out the same ones, and the commands that follow pass them on literally, as a reader does.
//!
//! A command that exits non-zero must be followed by `echo $?`, so that no failure goes by
//! unseen. `BLESS=1` writes what the commands printed into the file instead of comparing, as it
//! does for the golden files: review the diff. ```sh blocks are steps the test cannot take (installing, starting a server, a
//! system's package manager) and must not call a server: that would be an example no test runs.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::LazyLock;
use std::time::Duration;

use regex::Regex;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout};

use crate::harness::{TestApp, url_of};

/// The address the docs name, `snapfence serve`'s default.
const DOCUMENTED: &str = "127.0.0.1:7878";
/// How long one command may take before the test gives up on it.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);
/// The line the session prints after each command, with the command's exit status.
const DONE: &str = "<<snapfence-docs-example-done>>";

/// One `$ command` of a ```console block and the lines printed under it.
#[derive(Debug)]
struct Example {
    /// Where the command starts, for messages (`README.md:42`).
    at: String,
    /// The command, continuation lines included.
    command: String,
    /// What it prints, trailing blank lines left out.
    expected: Vec<String>,
    /// The index of the file's line where `expected` starts, for `BLESS=1`.
    output_at: usize,
}

/// The examples of a Markdown file, in order; panics on a ```sh block that calls a server and
/// on shell blocks of other kinds, which nothing would run.
fn examples(name: &str, text: &str) -> Vec<Example> {
    let mut all = Vec::new();
    let mut fence: Option<&str> = None;
    let mut continued = false;
    for (i, line) in text.lines().enumerate() {
        let at = format!("{name}:{}", i + 1);
        match fence {
            None => {
                if let Some(info) = line.strip_prefix("```").filter(|i| !i.is_empty()) {
                    assert!(
                        !matches!(info, "bash" | "shell" | "shell-session" | "zsh"),
                        "{at}: a ```{info} block: write ```console for an example the docs test runs, or ```sh for a set-up step it cannot"
                    );
                    fence = Some(info);
                }
            }
            Some(_) if line == "```" => fence = None,
            Some("sh") => assert!(
                !CALLS_A_SERVER.is_match(line),
                "{at}: a ```sh block calls the server, so no test would run it; make it a ```console block with its output"
            ),
            Some("console") if continued => {
                let example: &mut Example = all.last_mut().expect("a command goes on");
                example.command.push('\n');
                example.command.push_str(line);
                example.output_at = i + 1;
                continued = line.ends_with('\\');
            }
            Some("console") => match line.strip_prefix("$ ") {
                Some(command) => {
                    continued = command.ends_with('\\');
                    all.push(Example {
                        at,
                        command: command.to_owned(),
                        expected: Vec::new(),
                        output_at: i + 1,
                    });
                }
                None => all
                    .last_mut()
                    .unwrap_or_else(|| panic!("{at}: output before any `$ ` command"))
                    .expected
                    .push(line.to_owned()),
            },
            Some(_) => {}
        }
    }
    for example in &mut all {
        trim_blank_tail(&mut example.expected);
    }
    all
}

/// A command line that talks to a snapfence server.
static CALLS_A_SERVER: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^\s*(\$ )?(curl\b|snapfence (lease|snapshot|audit|run|keys)\b)").unwrap()
});

fn trim_blank_tail(lines: &mut Vec<String>) {
    while lines.last().is_some_and(|l| l.trim().is_empty()) {
        lines.pop();
    }
}

/// What differs between two runs on a fresh server, and what stands for it.
static MASKS: LazyLock<Vec<(Regex, &'static str)>> = LazyLock::new(|| {
    [
        (r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", "<time>"),
        (
            r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
            "<uuid>",
        ),
        (r#"("remote_addr": ?)"[^"]*""#, r#"$1"<address>""#),
        (r#"("pid": ?)\d+"#, "$1<pid>"),
        (r"\bsf_(\d+)_[A-Za-z0-9_-]+", "sf_${1}_<secret>"),
        (r"\(retrying in [^)]*\)", "(retrying in <pause>)"),
        (
            r"waiting up to [0-9a-z ]+ more",
            "waiting up to <time left> more",
        ),
    ]
    .into_iter()
    .map(|(pattern, with)| (Regex::new(pattern).unwrap(), with))
    .collect()
});

/// `line` with what differs between runs masked, and without trailing blanks, which editors
/// strip from the docs.
fn masked(line: &str) -> String {
    MASKS
        .iter()
        .fold(line.trim_end().to_owned(), |text, (pattern, with)| {
            pattern.replace_all(&text, *with).into_owned()
        })
}

/// A bash session in a scratch directory, with the server's address in `SNAPFENCE_URL`, its
/// database in `DATABASE_URL` (for `snapfence keys`), and the built `snapfence` first on PATH.
struct Session {
    bash: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
    /// The address the server really listens on, for the one the docs name.
    server: String,
    _scratch: tempfile::TempDir,
}

impl Session {
    async fn start(app: &TestApp) -> Self {
        let scratch = tempfile::Builder::new()
            .prefix("sf-tmp-docs-")
            .tempdir()
            .unwrap();
        let bin = Path::new(env!("CARGO_BIN_EXE_snapfence")).parent().unwrap();
        let path = std::env::join_paths(std::iter::once(bin.to_path_buf()).chain(
            std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
        ))
        .unwrap();
        let mut command = tokio::process::Command::new("bash");
        command
            .args(["--noprofile", "--norc"])
            .env_clear()
            .env("PATH", path)
            .env("HOME", scratch.path())
            .env("SNAPFENCE_URL", &app.instance.base)
            .env("DATABASE_URL", url_of(&app.options))
            .current_dir(scratch.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        if let Some(password) = std::env::var_os("PGPASSWORD") {
            command.env("PGPASSWORD", password);
        }
        let mut bash = command.spawn().expect("bash");
        let mut input = bash.stdin.take().unwrap();
        // Everything the session prints is read from stdout: bash's own complaints (a quote
        // left open) too, as on a terminal.
        input.write_all(b"exec 2>&1\n").await.unwrap();
        let output = BufReader::new(bash.stdout.take().unwrap());
        let server = app.instance.base.trim_start_matches("http://").to_owned();
        Self {
            bash,
            input,
            output,
            server,
            _scratch: scratch,
        }
    }

    /// Runs one command; returns its exit status and its output lines, trailing blank lines
    /// left out and the server's address written as the docs write it.
    async fn run(&mut self, command: &str) -> (i32, Vec<String>) {
        let command = command.replace("localhost:7878", DOCUMENTED);
        let command = command.replace(DOCUMENTED, &self.server);
        // Stdin is the script itself, so a command gets /dev/null instead (its own pipes
        // aside). `$?` is kept for the next command's `echo $?`.
        let script = format!(
            "{{\n{command}\n}} </dev/null\n__sf_status=$?; printf '\\n%s %d\\n' '{DONE}' $__sf_status; (exit $__sf_status)\n"
        );
        self.input.write_all(script.as_bytes()).await.unwrap();
        self.input.flush().await.unwrap();
        let mut lines = Vec::new();
        let status = tokio::time::timeout(COMMAND_TIMEOUT, async {
            loop {
                let mut raw = Vec::new();
                let read = self.output.read_until(b'\n', &mut raw).await.unwrap();
                assert!(read > 0, "bash ended; it printed {lines:#?}");
                let line = String::from_utf8_lossy(&raw);
                let line = line.trim_end_matches('\n');
                if let Some(status) = line.strip_prefix(DONE) {
                    return status.trim().parse::<i32>().unwrap();
                }
                lines.push(line.replace(&self.server, DOCUMENTED));
            }
        })
        .await
        .unwrap_or_else(|_| {
            panic!("`{command}` did not finish within {COMMAND_TIMEOUT:?}; it printed {lines:#?}")
        });
        trim_blank_tail(&mut lines);
        (status, lines)
    }

    async fn end(mut self) {
        self.input.write_all(b"exit\n").await.unwrap();
        self.bash.wait().await.unwrap();
    }
}

/// Runs every example of the files `names` (paths from the repository's root), one file after
/// the other, in one session against a fresh server, as a reader who goes on from one to the
/// next; panics at the first whose output differs from the docs. With `BLESS=1`, writes every
/// output into its file instead.
async fn answers_as_shown(names: &[&str]) {
    let bless = std::env::var_os("BLESS").is_some();
    let app = TestApp::spawn().await;
    let mut session = Session::start(&app).await;
    let mut unshown_failure: Option<(String, i32)> = None;
    for name in names {
        let path: PathBuf = [env!("CARGO_MANIFEST_DIR"), name].iter().collect();
        let text = std::fs::read_to_string(&path).unwrap();
        let all = examples(name, &text);
        assert!(!all.is_empty(), "{name} has no ```console examples");
        let printed = run_in_order(&mut session, &all, bless, &mut unshown_failure).await;
        if bless {
            std::fs::write(&path, blessed(&text, &all, &printed)).unwrap();
        }
    }
    if let Some((at, status)) = unshown_failure {
        panic!("{at}: the last example exits {status}; show it with `echo $?`");
    }
    session.end().await;
    app.stop().await;
}

/// Runs `all` in `session`, comparing each output with the docs' unless `bless`; returns what
/// each printed. `unshown_failure` carries a failed command over to the next example, which must
/// show its status, across files too.
async fn run_in_order(
    session: &mut Session,
    all: &[Example],
    bless: bool,
    unshown_failure: &mut Option<(String, i32)>,
) -> Vec<Vec<String>> {
    let mut printed = Vec::new();
    for example in all {
        if let Some((at, status)) = unshown_failure.take() {
            assert_eq!(
                example.command, "echo $?",
                "{at}: exits {status}; show it with `echo $?` on the next line, or fix the command"
            );
        }
        let (status, actual) = session.run(&example.command).await;
        let want: Vec<String> = example.expected.iter().map(|l| masked(l)).collect();
        let got: Vec<String> = actual.iter().map(|l| masked(l)).collect();
        assert!(
            bless || want == got,
            "{}: `{}` printed, masked:\n{}\n\nthe docs show, masked:\n{}\n\nas printed, to paste if the docs are wrong (or run with BLESS=1):\n{}\n",
            example.at,
            example.command,
            got.join("\n"),
            want.join("\n"),
            actual.join("\n"),
        );
        if status != 0 {
            *unshown_failure = Some((example.at.clone(), status));
        }
        printed.push(actual);
    }
    printed
}

/// `text` with each example's output replaced by what it printed.
fn blessed(text: &str, all: &[Example], printed: &[Vec<String>]) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    for (example, actual) in all.iter().zip(printed).rev() {
        let at = example.output_at;
        lines.splice(at..at + example.expected.len(), actual.iter().cloned());
    }
    lines.join("\n") + "\n"
}

#[tokio::test]
async fn the_readme_quick_start_answers_as_shown() {
    answers_as_shown(&["README.md"]).await;
}

#[tokio::test]
async fn the_tutorial_answers_as_shown_after_the_quick_start() {
    answers_as_shown(&["README.md", "docs/tutorial.md"]).await;
}

#[tokio::test]
async fn the_cli_reference_answers_as_shown() {
    answers_as_shown(&["docs/cli.md"]).await;
}

#[tokio::test]
async fn the_operations_guide_answers_as_shown() {
    answers_as_shown(&["docs/operations.md"]).await;
}

#[test]
fn the_readme_shows_the_operator_page_as_the_browser_test_takes_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    assert!(
        readme.contains("](docs/operator-page.png)"),
        "the README embeds docs/operator-page.png"
    );
    let png = std::fs::read(root.join("docs/operator-page.png")).unwrap_or_else(|e| {
        panic!(
            "docs/operator-page.png: {e}; make it with `SNAPFENCE_DOCS_SCREENSHOT=1 cargo test --locked --test ui a_lease_made_by_the_test`"
        )
    });
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n"),
        "docs/operator-page.png is a PNG"
    );
}

#[test]
fn the_other_guides_have_no_example_that_no_test_runs() {
    for name in [
        "docs/guarantees.md",
        "docs/CONTRIBUTING.md",
        "bench/README.md",
    ] {
        let path: PathBuf = [env!("CARGO_MANIFEST_DIR"), name].iter().collect();
        let all = examples(name, &std::fs::read_to_string(path).unwrap());
        assert!(
            all.is_empty(),
            "{name} has ```console examples: give it a test of its own here"
        );
    }
}

#[test]
fn masks_hide_what_differs_between_runs_and_keep_tokens() {
    let line = r#"{"token":7,"at":"2026-12-02T15:53:45.380Z","request_id":"8f3ef313-e32f-4dc2-a191-27c29f5bdaab","remote_addr":"127.0.0.1:56596","pid":4242}"#;
    assert_eq!(
        masked(line),
        r#"{"token":7,"at":"<time>","request_id":"<uuid>","remote_addr":"<address>","pid":<pid>}"#
    );
    assert_eq!(masked("sf_3_q3Jx-abc_9"), "sf_3_<secret>");
}

#[test]
fn a_console_block_gives_each_command_with_its_output() {
    let doc = "text\n```console\n$ a \\\n  --b\none\n\n$ c\n```\n";
    let all = examples("doc.md", doc);
    assert_eq!(all.len(), 2);
    assert_eq!(all[0].command, "a \\\n  --b");
    assert_eq!(all[0].expected, ["one"]);
    assert_eq!((all[1].at.as_str(), all[1].expected.len()), ("doc.md:7", 0));
}

#[test]
fn blessing_replaces_each_output_and_keeps_the_rest() {
    let doc = "```console\n$ a\nold\nolder\n\n$ b\n```\nafter\n";
    let all = examples("doc.md", doc);
    let printed = vec![vec!["new".to_owned()], vec!["b out".to_owned()]];
    assert_eq!(
        blessed(doc, &all, &printed),
        "```console\n$ a\nnew\n\n$ b\nb out\n```\nafter\n"
    );
}
