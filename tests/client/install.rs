//! The README's install snippet for shell completion and the manual, run as a newcomer pastes it:
//! in bash, in an empty home, with the built `snapfence` first on `PATH`. Each file it writes
//! must land where the snippet says, and hold what it should.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The README's ```sh block that installs completion and the manual, one command a line, with
/// the comments left out.
fn snippet() -> Vec<String> {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .expect("README.md");
    let mut block: Option<Vec<String>> = None;
    for line in readme.lines() {
        match &mut block {
            None if line == "```sh" => block = Some(Vec::new()),
            None => {}
            Some(lines) if line == "```" => {
                if lines.iter().any(|l| l.contains("snapfence completions")) {
                    return lines.clone();
                }
                block = None;
            }
            Some(lines) => {
                let command = line.split(" #").next().unwrap().trim_end();
                if !command.is_empty() {
                    lines.push(command.to_string());
                }
            }
        }
    }
    panic!("README.md has no ```sh block with `snapfence completions`");
}

/// Where a command of the snippet says it writes: the file after `>`, or the directory after
/// `--dir`, with `~` expanded.
fn destination(command: &str, home: &Path) -> Option<(PathBuf, bool)> {
    let expand = |p: &str| home.join(p.strip_prefix("~/").expect("a path under ~"));
    if let Some((_, file)) = command.split_once(" > ") {
        return Some((expand(file.trim()), false));
    }
    let words: Vec<&str> = command.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "--dir")?;
    Some((expand(words[at + 1]), true))
}

#[test]
fn the_readmes_completion_and_man_commands_work_in_an_empty_home() {
    let lines = snippet();
    assert!(
        lines[0].starts_with("mkdir -p "),
        "the snippet makes its directories first: {lines:?}"
    );
    let home = tempfile::Builder::new()
        .prefix("sf-tmp-home-")
        .tempdir()
        .unwrap();
    let bin = Path::new(env!("CARGO_BIN_EXE_snapfence")).parent().unwrap();
    let path = std::env::join_paths(
        std::iter::once(bin.to_path_buf())
            .chain(std::env::split_paths(&std::env::var_os("PATH").unwrap())),
    )
    .unwrap();
    let script = format!("set -eu\n{}\n", lines.join("\n"));
    let ran = Command::new("bash")
        .args(["-c", &script])
        .env_clear()
        .env("HOME", home.path())
        .env("PATH", path)
        .current_dir(home.path())
        .output()
        .expect("running bash");
    assert!(
        ran.status.success(),
        "the README's snippet failed in an empty home ({}):\n{script}\n{}",
        ran.status,
        String::from_utf8_lossy(&ran.stderr)
    );

    let written: Vec<(PathBuf, bool)> = lines
        .iter()
        .filter_map(|l| destination(l, home.path()))
        .collect();
    assert_eq!(
        written.len(),
        3,
        "bash's completion, zsh's and the man pages: {lines:?}"
    );
    let read = |p: &Path| {
        std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{} is not there: {e}", p.display()))
    };
    for (place, is_dir) in &written {
        if *is_dir {
            for page in ["snapfence.1", "snapfence-run.1", "snapfence-serve.1"] {
                let text = read(&place.join(page));
                assert!(
                    text.starts_with(".ie") || text.contains(".TH"),
                    "{page}: {text}"
                );
            }
            assert!(
                read(&place.join("snapfence-serve.1")).contains("/ui"),
                "serve's man page names the operator page"
            );
        } else {
            let text = read(place);
            assert!(text.contains("snapfence"), "{}: {text}", place.display());
        }
    }
    let bash = home
        .path()
        .join(".local/share/bash-completion/completions/snapfence");
    assert!(
        read(&bash).contains("complete "),
        "a bash completion script"
    );
    let zsh = home.path().join(".zfunc/_snapfence");
    assert!(
        read(&zsh).starts_with("#compdef snapfence"),
        "a zsh completion function"
    );
    let man1 = home.path().join(".local/share/man/man1");
    assert!(written.contains(&(man1, true)));
}

#[test]
fn serve_help_names_the_operator_page() {
    let ran = Command::new(env!("CARGO_BIN_EXE_snapfence"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    assert!(ran.status.success());
    let help = String::from_utf8(ran.stdout).unwrap();
    assert!(
        help.contains("operator page at /ui") && help.contains("http://127.0.0.1:7878/ui"),
        "{help}"
    );
}
