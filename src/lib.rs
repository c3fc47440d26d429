//! cvslurm: tell Arista CloudVision which Slurm job runs on which nodes.
//!
//! The library carries all the logic; the `cvslurm` binary only dispatches to [`cli::main`].
//! Other Rust tools can reuse the CloudVision client ([`cloudvision::Client`]) and the payload
//! types ([`cloudvision::payload::JobConfig`], [`cloudvision::payload::NodeConfig`]).
//!
//! Layout (internal, `pub(crate)`), one room per domain: `slurm` (what cvslurm reads from
//! Slurm and how it runs its commands), `cloudvision` (the client, TLS, payloads, batches),
//! `discovery` (a worker's record), `inventory` (the controller's node inventory and which
//! interfaces a job uses), `state` (StateDir: the outbox, its index, the wake socket),
//! `job_end` (how a job's end is judged), `service` (the service), `mode` (one module per
//! mode), and a few ground-floor files (configuration, logging, text, times). The `layers`
//! test below holds each room to what it may name. See docs/design.md.

#![warn(missing_docs)]

// The library's public surface: the command line (for main.rs), the CloudVision client, its
// configuration (`ClientOptions::from_config`, `Token`) and the payload types.
pub mod cli;
pub mod cloudvision;
pub mod config;

pub(crate) mod mode;

pub(crate) mod discovery;
pub(crate) mod inventory;
pub(crate) mod job_end;
pub(crate) mod link_names;
pub(crate) mod logging;
pub(crate) mod metrics;
pub(crate) mod privilege;
pub(crate) mod service;
pub(crate) mod slurm;
pub(crate) mod state;
pub(crate) mod systemd;
pub(crate) mod text;
pub(crate) mod timefmt;

/// Not an API: the internal pieces the integration tests (`tests/`) and the fuzz targets
/// (`fuzz/`, a separate crate) reach directly — the parsers of outside input and StateDir's
/// file names. Each path mirrors the internal module it comes from. May change at any time.
#[doc(hidden)]
pub mod internals {
    /// From `crate::inventory`.
    pub mod inventory {
        pub use crate::inventory::read_lines_capped;
        /// From `crate::inventory::discovery`.
        pub mod discovery {
            pub use crate::inventory::discovery::LabelledReader;
        }
    }
    /// From `crate::discovery`.
    pub mod discovery {
        /// From `crate::discovery::record`.
        pub mod record {
            pub use crate::discovery::record::{DiscoverRecord, RecordReader};
        }
        /// From `crate::discovery::published`.
        pub mod published {
            pub use crate::discovery::published::{decode, encode, MAX_PUBLISHED, PREFIX};
        }
    }
    /// From `crate::job_end`.
    pub mod job_end {
        pub use crate::job_end::{parse_exit_code, HookEnv};
    }
    /// From `crate::slurm`.
    pub mod slurm {
        pub use crate::slurm::{
            node_state_available, parse_cluster_name, parse_job_gpus, parse_sinfo, pick,
            valid_job_id,
        };
        /// From `crate::slurm::nodes`.
        pub mod nodes {
            pub use crate::slurm::nodes::parse_published;
        }
        /// From `crate::slurm::hostlist`.
        pub mod hostlist {
            pub use crate::slurm::hostlist::{expand, MAX_BYTES, MAX_HOSTS};
        }
        /// From `crate::slurm::json`.
        pub mod json {
            pub use crate::slurm::json::parse_jobs;
        }
        /// From `crate::slurm::ctld_process`.
        pub mod ctld_process {
            pub use crate::slurm::ctld_process::find_here;
        }
        /// From `crate::slurm::leader`.
        pub mod leader {
            pub use crate::slurm::leader::{
                controllers, is_this_host, leader, leader_from, parse_controller, parse_heartbeat,
                slurmctld_timeout_s, stale_after_s, Controller, Heartbeat, Leader, HEARTBEAT_LEN,
            };
        }
    }
    /// From `crate::state`.
    pub mod state {
        pub use crate::state::layout;
        /// From `crate::state::durable`.
        pub mod durable {
            pub use crate::state::durable::lock_file;
        }
        /// From `crate::state::queue`.
        pub mod queue {
            pub use crate::state::queue::outbox_view;
        }
    }
    /// From `crate::timefmt`.
    pub mod timefmt {
        pub use crate::timefmt::{format_epoch, parse_slurm_epoch, parse_user_time};
    }
}

/// The layers hold: every room names only the rooms its row of [`ROOMS`](layers::ROOMS)
/// allows, and no module names another that names it back, directly or round a cycle. Read
/// from the sources at test time (every `.rs` file under `src/`, code lines only: not
/// comments, not `#[cfg(test)]` modules), so a new file is held to its room's row at once.
#[cfg(test)]
mod layers {
    /// Every room (a folder or a file at the top of `src/`) and what its code may name
    /// besides itself: another room (and all of it), or one module of one (`cloudvision::tls`).
    /// A file of a room is held to its row the day it is written; a new room needs a row.
    const ROOMS: &[(&str, &[&str])] = &[
        // The ground floor: small pieces every room may use.
        ("text", &[]),
        ("timefmt", &[]),
        ("link_names", &[]),
        ("systemd", &[]),
        ("logging", &["text", "timefmt"]),
        // Configuration (the pins' parser is the TLS module's) and dropping root.
        ("config", &["cloudvision::tls"]),
        ("privilege", &["config", "slurm::conf"]),
        // Slurm: its commands, parsers, slurm.conf and controllers (a leader's heartbeat is
        // a file read as StateDir's are).
        ("slurm", &["config", "state::durable", "text", "timefmt"]),
        // CloudVision: the client, TLS, the payloads (built from Slurm's facts), batches.
        ("cloudvision", &["config", "slurm", "text", "timefmt"]),
        // The worker's side of discovery: its record and topology.
        (
            "discovery",
            &[
                "cloudvision::payload",
                "cloudvision::tls",
                "config",
                "logging",
                "timefmt",
            ],
        ),
        // StateDir: the outbox, its index, the wake socket, marks and the nodes' records.
        (
            "state",
            &[
                "cloudvision::payload",
                "discovery::record",
                "text",
                "timefmt",
            ],
        ),
        // How a job's end is judged.
        (
            "job_end",
            &["cloudvision::payload", "slurm", "state", "timefmt"],
        ),
        // The controller's side: nodes, their records, which interfaces a job uses.
        (
            "inventory",
            &[
                "cloudvision",
                "config",
                "discovery",
                "logging",
                "metrics",
                "slurm",
                "state",
                "text",
                "timefmt",
            ],
        ),
        // The metrics file (it counts the JobCompForward spool too).
        (
            "metrics",
            &["service::forward", "slurm", "state", "text", "timefmt"],
        ),
        // The service: its loop, senders, delivery engine, reconciliation, resends.
        (
            "service",
            &[
                "cloudvision",
                "config",
                "discovery",
                "inventory",
                "job_end",
                "logging",
                "metrics",
                "slurm",
                "state",
                "systemd",
                "text",
                "timefmt",
            ],
        ),
        // One module per mode, and the check.
        (
            "mode",
            &[
                "cloudvision",
                "config",
                "discovery",
                "inventory",
                "job_end",
                "link_names",
                "logging",
                "metrics",
                "privilege",
                "service",
                "slurm",
                "state",
                "text",
                "timefmt",
            ],
        ),
        // The command line.
        ("cli", &["config", "link_names", "mode"]),
    ];

    /// The room a module is in: its first segment (`slurm::leader` is in `slurm`).
    fn room(module: &str) -> &str {
        module.split("::").next().unwrap_or(module)
    }

    /// Each edge of `g` its row in `rooms` does not allow, as `from -> to`; a module whose
    /// room has no row is one too.
    fn violations(g: &Graph, rooms: &[(&str, &[&str])]) -> Vec<String> {
        let mut out = Vec::new();
        for (m, edges) in g {
            let Some((_, allowed)) = rooms.iter().find(|(r, _)| *r == room(m)) else {
                out.push(format!("{m}: its room has no row in ROOMS"));
                continue;
            };
            for t in edges {
                let ok = room(t) == room(m)
                    || allowed
                        .iter()
                        .any(|a| t == a || t.starts_with(&format!("{a}::")));
                if !ok {
                    out.push(format!("{m} -> {t}"));
                }
            }
        }
        out
    }

    #[test]
    fn every_room_names_only_what_its_row_allows() {
        let g = graph(&sources());
        let bad = violations(&g, ROOMS);
        assert!(
            bad.is_empty(),
            "imports ROOMS does not allow (move what is needed down, or give the room its \
             row):\n{}",
            bad.join("\n")
        );
        let rooms: BTreeSet<&str> = g.keys().map(|m| room(m)).collect();
        for (r, _) in ROOMS {
            assert!(
                rooms.contains(r),
                "ROOMS has a row for {r}, which src/ does not have"
            );
        }
    }

    #[test]
    fn the_room_check_sees_a_slip() {
        let files = [
            ("lib.rs", "pub mod low;\npub mod high;\npub mod new;\n"),
            ("low/mod.rs", "pub mod a;\n"),
            ("low/a.rs", "use crate::high::h;\n"),
            ("high.rs", "use crate::low::a;\n"),
            ("new.rs", "use crate::low;\n"),
        ]
        .map(|(p, s)| (p.to_string(), s.to_string()));
        let rooms: &[(&str, &[&str])] = &[("low", &[]), ("high", &["low"])];
        assert_eq!(
            violations(&graph(&files), rooms),
            ["low::a -> high", "new: its room has no row in ROOMS"]
        );
    }

    use std::collections::{BTreeMap, BTreeSet};
    use std::path::Path;

    /// Each module and the other modules its code names.
    type Graph = BTreeMap<String, BTreeSet<String>>;

    /// The module a file under `src/` is (`a/b.rs` and `a/b/mod.rs` are `a::b`); `None` for the
    /// crate root (`lib.rs`, `main.rs`), which declares everything.
    fn module_of(rel: &Path) -> Option<String> {
        let mut parts: Vec<String> = rel
            .with_extension("")
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        if parts.last().map(String::as_str) == Some("mod") {
            parts.pop();
        }
        match parts.as_slice() {
            [one] if one == "lib" || one == "main" => None,
            [] => None,
            _ => Some(parts.join("::")),
        }
    }

    /// The code of a source: comment lines, trailing comments and `#[cfg(test)]` modules
    /// (rustfmt's layout: from `#[cfg(test)]` and `mod x {` to the `}` in column 0) left out.
    fn code(src: &str) -> String {
        let mut out = String::new();
        let mut lines = src.lines().peekable();
        while let Some(line) = lines.next() {
            let next = lines.peek().copied().unwrap_or("");
            let opens_mod = next.ends_with('{')
                && ["mod ", "pub mod ", "pub(crate) mod "]
                    .iter()
                    .any(|p| next.starts_with(p));
            if line == "#[cfg(test)]" && opens_mod {
                for l in lines.by_ref() {
                    if l == "}" {
                        break;
                    }
                }
                continue;
            }
            let t = line.trim_start();
            if t.starts_with("//") {
                continue;
            }
            let line = match line.find("//") {
                Some(i) if !line[..i].contains('"') => &line[..i],
                _ => line,
            };
            out.push_str(line);
            out.push('\n');
        }
        out
    }

    /// The paths a use tree or path starting at `s` names (`a::{b, c::d as e}::*` gives `a::b`,
    /// `a::c::d`), and the rest of `s`.
    fn use_tree(s: &str) -> (Vec<Vec<String>>, &str) {
        let mut prefix = Vec::new();
        let mut s = s.trim_start();
        loop {
            let n = s
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(s.len());
            if n > 0 {
                prefix.push(s[..n].to_string());
                s = s[n..].trim_start();
                match s.strip_prefix("::") {
                    Some(rest) => {
                        s = rest.trim_start();
                        continue;
                    }
                    None => return (vec![prefix], s),
                }
            }
            let Some(mut rest) = s.strip_prefix('{') else {
                return (vec![prefix], s);
            };
            let mut out = Vec::new();
            loop {
                rest = rest.trim_start();
                if let Some(r) = rest.strip_prefix('}') {
                    if out.is_empty() {
                        out.push(prefix.clone());
                    }
                    return (out, r);
                }
                if rest.is_empty() {
                    return (out, rest);
                }
                let (paths, r) = use_tree(rest);
                let r = match r.trim_start().strip_prefix("as ") {
                    Some(r) => r
                        .trim_start()
                        .trim_start_matches(|c: char| c.is_ascii_alphanumeric() || c == '_'),
                    None => r,
                };
                let r = r.trim_start();
                let r = r.strip_prefix('*').unwrap_or(r).trim_start();
                out.extend(paths.into_iter().map(|p| [prefix.clone(), p].concat()));
                rest = r.strip_prefix(',').unwrap_or(r);
                if rest.len() == r.len() && !rest.trim_start().starts_with('}') {
                    // Neither a comma nor the group's end: not a use tree; stop here.
                    return (out, rest);
                }
            }
        }
    }

    /// The module graph of `files` (path under `src/`, source): an edge where a module's code
    /// names another through `crate::` or `super::` (to the longest module the path starts
    /// with). A module and its own parent or child are no edge: declaring is not depending.
    /// `super::` is the file's parent: inside an inline module other than a test module it
    /// would read one level off (no such module in src/ uses `super::`).
    fn graph(files: &[(String, String)]) -> Graph {
        let mods: BTreeMap<String, &str> = files
            .iter()
            .filter_map(|(rel, src)| Some((module_of(Path::new(rel))?, src.as_str())))
            .collect();
        let mut g = Graph::new();
        for (m, src) in &mods {
            let here: Vec<&str> = m.split("::").collect();
            let code = code(src);
            let mut edges = BTreeSet::new();
            let mut rest = code.as_str();
            while let Some(i) = rest
                .find("crate::")
                .into_iter()
                .chain(rest.find("super::"))
                .min()
            {
                let word_start = rest[..i]
                    .chars()
                    .next_back()
                    .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
                let (paths, after) = use_tree(&rest[i..]);
                rest = if after.len() < rest.len() - i {
                    after
                } else {
                    &rest[i + 1..]
                };
                if !word_start {
                    continue;
                }
                for p in paths {
                    let mut full: Vec<&str> = Vec::new();
                    for (k, seg) in p.iter().enumerate() {
                        match seg.as_str() {
                            "crate" if k == 0 => full.clear(),
                            "super" if k == 0 => {
                                full = here[..here.len() - 1].to_vec();
                            }
                            "super" => {
                                full.pop();
                            }
                            "self" if k > 0 => {}
                            s => full.push(s),
                        }
                    }
                    let target = (1..=full.len())
                        .rev()
                        .map(|n| full[..n].join("::"))
                        .find(|t| mods.contains_key(t));
                    if let Some(t) = target {
                        let related = t == *m
                            || m.starts_with(&format!("{t}::"))
                            || t.starts_with(&format!("{m}::"));
                        if !related {
                            edges.insert(t);
                        }
                    }
                }
            }
            g.insert(m.clone(), edges);
        }
        g
    }

    /// A cycle in `g` (`a -> b -> a`), if any.
    fn cycle(g: &Graph) -> Option<Vec<String>> {
        fn visit(
            g: &Graph,
            m: &str,
            path: &mut Vec<String>,
            done: &mut BTreeSet<String>,
        ) -> Option<Vec<String>> {
            if let Some(i) = path.iter().position(|p| p == m) {
                let mut c = path[i..].to_vec();
                c.push(m.to_string());
                return Some(c);
            }
            if done.contains(m) {
                return None;
            }
            path.push(m.to_string());
            for next in g.get(m).into_iter().flatten() {
                if let Some(c) = visit(g, next, path, done) {
                    return Some(c);
                }
            }
            path.pop();
            done.insert(m.to_string());
            None
        }
        let mut done = BTreeSet::new();
        g.keys()
            .find_map(|m| visit(g, m, &mut Vec::new(), &mut done))
    }

    /// Every `.rs` file under `src/`: its path there and its text.
    fn sources() -> Vec<(String, String)> {
        let root = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src"));
        let mut out = Vec::new();
        let mut dirs = vec![root.to_path_buf()];
        while let Some(dir) = dirs.pop() {
            for e in std::fs::read_dir(&dir).expect("src/ is readable") {
                let path = e.expect("src/ is readable").path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|x| x == "rs") {
                    let rel = path
                        .strip_prefix(root)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned();
                    let text = std::fs::read_to_string(&path).expect("a source is UTF-8");
                    out.push((rel, text));
                }
            }
        }
        out
    }

    #[test]
    fn no_module_names_one_that_names_it_back() {
        let files = sources();
        assert!(files.len() > 50, "read {} files under src/", files.len());
        let g = graph(&files);
        if let Some(c) = cycle(&g) {
            panic!(
                "module cycle: {}: move what the lower module needs down to it (or to a \
                 ground-floor module both name)",
                c.join(" -> ")
            );
        }
    }

    #[test]
    fn the_cycle_check_sees_a_planted_cycle() {
        let fake = |a: &str, b: &str| {
            vec![
                ("lib.rs".to_string(), "pub mod x;\npub mod y;\n".to_string()),
                ("x.rs".to_string(), a.to_string()),
                ("y/mod.rs".to_string(), "pub mod z;\n".to_string()),
                ("y/z.rs".to_string(), b.to_string()),
            ]
        };
        // x -> y::z -> x, through a use group and a `super::super::` path.
        let g = graph(&fake(
            "use crate::{text, y::{z::Z as W, self}};\n",
            "fn f() { super::super::x::g() }\n",
        ));
        assert_eq!(cycle(&g).unwrap(), ["x", "y::z", "x"], "{g:?}");
        // Comments, test modules and a child naming its parent are no edge.
        let g = graph(&fake(
            "use crate::y::z::Z;\n",
            "// crate::x\nuse super::Y; // crate::x::a\n#[cfg(test)]\nmod tests {\n    use crate::x;\n}\n",
        ));
        assert_eq!(cycle(&g), None, "{g:?}");
        assert!(g["y::z"].is_empty(), "{g:?}");
        assert_eq!(g["x"], BTreeSet::from(["y::z".to_string()]));
    }
}
