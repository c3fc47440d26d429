//! The documentation names everything the binary has: each test asks the built binary for its
//! lists (`--list-modes`, `--list-config-keys`, `--list-flags MODE`) and fails when the man
//! pages, the example config, the bash completion or README.md leave an entry out. README.md
//! also stays within its line budget, and its relative links point at files that exist.

use std::path::Path;
use std::process::Command;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_cvslurm")
}

/// The lines the binary prints for `args` (exit 0 required).
fn lines(args: &[&str]) -> Vec<String> {
    let out = Command::new(bin()).args(args).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "cvslurm {args:?}: {out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(!text.trim().is_empty(), "cvslurm {args:?} printed nothing");
    text.lines().map(String::from).collect()
}

/// (mode, its link names) from `cvslurm --list-modes`.
fn modes() -> Vec<(String, Vec<String>)> {
    lines(&["--list-modes"])
        .iter()
        .map(|l| {
            let mut w = l.split_whitespace().map(String::from);
            let mode = w.next().unwrap();
            let names: Vec<String> = w.collect();
            assert!(!names.is_empty(), "{mode} has no link name");
            (mode, names)
        })
        .collect()
}

/// Every cloudvision.conf key, from `cvslurm --list-config-keys` (`Key=default`).
fn keys() -> Vec<(String, String)> {
    lines(&["--list-config-keys"])
        .iter()
        .map(|l| {
            let (k, d) = l.split_once('=').unwrap_or_else(|| panic!("{l:?}"));
            (k.to_string(), d.to_string())
        })
        .collect()
}

fn flags(mode: &str) -> Vec<String> {
    lines(&["--list-flags", mode])
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(rel))
        .unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// How roff writes a word: `-` is `\-`.
fn roff(word: &str) -> String {
    word.replace('-', "\\-")
}

/// Fails listing every `(what, word)` missing from the document `doc`.
fn all_present(doc: &str, missing: Vec<String>) {
    assert!(
        missing.is_empty(),
        "{doc} does not mention: {}",
        missing.join(", ")
    );
}

#[test]
fn the_lists_are_not_empty_and_agree_with_the_parser() {
    let m = modes();
    assert!(m.iter().any(|(mode, _)| mode == "hook"));
    assert!(m.iter().any(|(mode, _)| mode == "check"));
    assert!(keys().iter().any(|(k, _)| k == "ApiServer"));
    for (mode, _) in &m {
        flags(mode);
    }
    let out = Command::new(bin())
        .args(["--list-flags", "bogus"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no such mode"));
}

#[test]
fn man_page_cvslurm_8_names_every_mode_link_and_flag() {
    let man = read("packaging/man/cvslurm.8");
    let mut missing = Vec::new();
    for (mode, names) in modes() {
        if !man.contains(&format!(".B {mode}\n")) {
            missing.push(format!("mode {mode} (a .B {mode} line)"));
        }
        for n in names.iter().filter(|n| !n.ends_with(".py")) {
            if !man.contains(&roff(n)) {
                missing.push(format!("link name {n}"));
            }
        }
        for f in flags(&mode) {
            if !man.contains(&roff(&f)) {
                missing.push(format!("{mode} {f}"));
            }
        }
    }
    all_present("packaging/man/cvslurm.8", missing);
}

#[test]
fn man_page_cloudvision_conf_5_names_every_key_with_its_default() {
    let man = read("packaging/man/cloudvision.conf.5");
    let mut missing = Vec::new();
    for (k, default) in keys() {
        let Some(at) = man.find(&format!(".BI {k}= ")) else {
            missing.push(format!("key {k} (a .BI {k}= line)"));
            continue;
        };
        if !default.is_empty() {
            // The key's paragraph (up to the next .TP or section) gives the default.
            let para = &man[at..];
            let end = para[1..]
                .find("\n.TP")
                .or_else(|| para[1..].find("\n.SH"))
                .map_or(para.len(), |e| e + 1);
            if !para[..end].contains(&format!("\"{}\"", roff(&default))) {
                missing.push(format!("default of {k} ({default})"));
            }
        }
    }
    all_present("packaging/man/cloudvision.conf.5", missing);
}

#[test]
fn example_config_has_every_key_with_its_default() {
    let ex = read("packaging/cloudvision.conf.example");
    let mut missing = Vec::new();
    for (k, default) in keys() {
        let line = ex
            .lines()
            .find(|l| l.trim_start_matches('#').starts_with(&format!("{k}=")));
        match line {
            None => missing.push(format!("key {k} (a #{k}= line)")),
            Some(l) if !default.is_empty() && *l != format!("#{k}={default}") => {
                missing.push(format!("{k}={default} (it says {l:?})"))
            }
            Some(_) => {}
        }
    }
    all_present("packaging/cloudvision.conf.example", missing);
}

#[test]
fn bash_completion_knows_every_mode_link_and_flag() {
    let comp = read("packaging/completions/cvslurm.bash");
    let mut missing = Vec::new();
    let complete_line = comp
        .split("complete -F _cvslurm")
        .nth(1)
        .expect("a complete -F _cvslurm line")
        .replace("\\\n", " ");
    let completed: Vec<&str> = complete_line.split_whitespace().collect();
    for (mode, names) in modes() {
        // The flags offered for the mode: its line in _cvslurm_mode_opts.
        let opts = comp
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{mode}) echo ")))
            .unwrap_or_default();
        if opts.is_empty() {
            missing.push(format!("mode {mode} in _cvslurm_mode_opts"));
        }
        let offered: Vec<&str> = opts.split(['"', ' ']).collect();
        for f in flags(&mode) {
            if !offered.contains(&f.as_str()) {
                missing.push(format!("{mode} {f}"));
            }
        }
        for n in &names {
            if !completed.contains(&n.as_str()) {
                missing.push(format!("link name {n} in the complete line"));
            }
            // The mode is known from the link name (a trailing .py is cut first).
            let bare = n.strip_suffix(".py").unwrap_or(n);
            let picks = comp.lines().any(|l| {
                l.contains(&format!("mode={mode} ;;"))
                    && l.split([' ', '|', ')']).any(|w| w == bare)
            });
            if !picks {
                missing.push(format!("{bare}) mode={mode}"));
            }
        }
    }
    all_present("packaging/completions/cvslurm.bash", missing);
}

#[test]
fn readme_names_every_mode_link_key_and_flag() {
    let readme = read("README.md");
    let mut missing = Vec::new();
    for (mode, names) in modes() {
        let heading = readme
            .lines()
            .any(|l| l.starts_with("### ") && l[4..].split([' ', ',']).any(|w| w == mode));
        if !readme.contains(&format!("cvslurm {mode}")) && !heading {
            missing.push(format!("`cvslurm {mode}` or a ### {mode} section"));
        }
        for n in names.iter().filter(|n| !n.ends_with(".py")) {
            if !readme.contains(n.as_str()) {
                missing.push(format!("link name {n}"));
            }
        }
        for f in flags(&mode) {
            if !readme.contains(&f) {
                missing.push(format!("{mode} {f}"));
            }
        }
    }
    for (k, _) in keys() {
        if !readme.contains(&format!("`{k}`")) && !readme.contains(&format!("{k}=")) {
            missing.push(format!("key {k}"));
        }
    }
    all_present("README.md", missing);
}

/// README.md is the admin's reference, read in one sitting: measurements, mechanism and test
/// narrative belong in docs/performance.md, docs/design.md and DEVELOPMENT.md.
#[test]
fn readme_stays_within_its_line_budget() {
    const BUDGET: usize = 600;
    let lines = read("README.md").lines().count();
    assert!(
        lines <= BUDGET,
        "README.md has {lines} lines, over its budget of {BUDGET}: move measurements to \
         docs/performance.md, mechanism to docs/design.md, test narrative to DEVELOPMENT.md"
    );
}

/// The targets of README.md's Markdown links (`[text](target)`) outside code blocks.
fn markdown_links(doc: &str) -> Vec<String> {
    let mut links = Vec::new();
    let mut in_code = false;
    for line in doc.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let end = rest.find(')').unwrap_or(rest.len());
            links.push(rest[..end].to_string());
            rest = &rest[end..];
        }
    }
    links
}

#[test]
fn readme_relative_links_point_at_files_that_exist() {
    let readme = read("README.md");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let links = markdown_links(&readme);
    assert!(
        links.iter().any(|l| l.starts_with("docs/design.md")),
        "README.md links to docs/design.md"
    );
    let mut missing = Vec::new();
    for link in &links {
        let file = link.split('#').next().unwrap_or_default();
        if file.is_empty() || file.contains("://") || file.starts_with("mailto:") {
            continue;
        }
        if !root.join(file).exists() {
            missing.push(link.clone());
        }
    }
    assert!(
        missing.is_empty(),
        "README.md links to files that do not exist: {}",
        missing.join(", ")
    );
}
