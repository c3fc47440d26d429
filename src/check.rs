//! `cvslurm check`: is this machine set up right? One line per check, `ok   …` or
//! `FAIL …: what to do`; exit 1 when any check fails.
//!
//! Checks, in order: the config file loads; a server and a token are configured and the token
//! file is private and readable by SlurmUser; CloudVision answers over TLS with the token;
//! slurm.conf (with its `Include`s) runs a cvslurm hook as PrologSlurmctld and
//! EpilogSlurmctld; SlurmUser can write StateDir and LogFile.

use crate::cloudvision::{Client, ClientOptions};
use crate::config::Config;
use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Where slurm.conf is when `$SLURM_CONF` does not say.
pub const DEFAULT_SLURM_CONF: &str = "/etc/slurm/slurm.conf";

/// Include nesting deeper than this is taken for a loop.
const MAX_INCLUDE_DEPTH: usize = 16;

/// One `Key=Value` of slurm.conf and where it was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    /// The value, unquoted, comment stripped.
    pub value: String,
    /// The file it was read from.
    pub file: PathBuf,
    /// 1-based line number in that file.
    pub line: usize,
}

/// The settings of slurm.conf that `check` needs, every occurrence in file order.
#[derive(Debug, Default, Clone)]
pub struct SlurmConf {
    /// Lower-cased key → every occurrence, in the order slurmctld reads them.
    pub settings: HashMap<String, Vec<Setting>>,
    /// Problems met while reading (unreadable Include, include loop).
    pub problems: Vec<String>,
}

impl SlurmConf {
    /// Every occurrence of a key (case-insensitive).
    pub fn all(&self, key: &str) -> &[Setting] {
        self.settings
            .get(&key.to_ascii_lowercase())
            .map_or(&[], Vec::as_slice)
    }

    /// The value slurmctld uses: the last occurrence.
    pub fn last(&self, key: &str) -> Option<&Setting> {
        self.all(key).last()
    }
}

/// Reads slurm.conf at `path`, following `Include` lines (relative to the including file's
/// directory, `*`/`?` wildcards allowed), with `read` doing the reading (tests pass a map).
pub fn parse_slurm_conf(
    path: &Path,
    read: &dyn Fn(&Path) -> std::io::Result<String>,
    list_dir: &dyn Fn(&Path) -> Vec<PathBuf>,
) -> Result<SlurmConf, String> {
    let text = read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut conf = SlurmConf::default();
    parse_into(&mut conf, path, &text, read, list_dir, 0);
    Ok(conf)
}

fn parse_into(
    conf: &mut SlurmConf,
    path: &Path,
    text: &str,
    read: &dyn Fn(&Path) -> std::io::Result<String>,
    list_dir: &dyn Fn(&Path) -> Vec<PathBuf>,
    depth: usize,
) {
    let dir = path.parent().unwrap_or(Path::new("/"));
    for (n, raw) in text.lines().enumerate() {
        let line = strip_slurm_comment(raw);
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(target) = include_target(line) {
            let target = Path::new(target);
            let target = if target.is_absolute() {
                target.to_path_buf()
            } else {
                dir.join(target)
            };
            if depth + 1 > MAX_INCLUDE_DEPTH {
                conf.problems.push(format!(
                    "{}:{}: Include nested more than {MAX_INCLUDE_DEPTH} deep (a loop?)",
                    path.display(),
                    n + 1
                ));
                continue;
            }
            for file in expand_include(&target, list_dir) {
                match read(&file) {
                    Ok(t) => parse_into(conf, &file, &t, read, list_dir, depth + 1),
                    Err(e) => conf.problems.push(format!(
                        "{}:{}: cannot read Include {}: {e}",
                        path.display(),
                        n + 1,
                        file.display()
                    )),
                }
            }
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let key = key.trim();
        if key.is_empty() || key.contains(char::is_whitespace) {
            continue;
        }
        // A line may hold several pairs (NodeName=n1 CPUs=8); the first value ends at a blank
        // unless quoted. Hook paths hold no blanks.
        let value = value.trim();
        let value = if let Some(rest) = value.strip_prefix('"') {
            rest.split('"').next().unwrap_or("")
        } else {
            value.split_whitespace().next().unwrap_or("")
        };
        conf.settings
            .entry(key.to_ascii_lowercase())
            .or_default()
            .push(Setting {
                value: value.to_string(),
                file: path.to_path_buf(),
                line: n + 1,
            });
    }
}

/// The target of an `Include` line (keyword case-insensitive), if it is one.
fn include_target(line: &str) -> Option<&str> {
    let (word, rest) = line.split_once(char::is_whitespace)?;
    if !word.eq_ignore_ascii_case("include") || rest.trim_start().starts_with('=') {
        return None;
    }
    let t = rest.trim();
    let t = t
        .strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or(t);
    (!t.is_empty()).then_some(t)
}

/// `#` starts a comment unless escaped as `\#`.
fn strip_slurm_comment(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'#') => {
                out.push('#');
                chars.next();
            }
            '#' => break,
            _ => out.push(c),
        }
    }
    out
}

/// An Include target with wildcards in its last component → the matching files, sorted.
fn expand_include(target: &Path, list_dir: &dyn Fn(&Path) -> Vec<PathBuf>) -> Vec<PathBuf> {
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if !name.contains(['*', '?']) {
        return vec![target.to_path_buf()];
    }
    let dir = target.parent().unwrap_or(Path::new("/"));
    let mut files: Vec<PathBuf> = list_dir(dir)
        .into_iter()
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| wildcard_match(&name, &n.to_string_lossy()))
        })
        .collect();
    files.sort();
    files
}

/// Shell-style `*` and `?` matching.
fn wildcard_match(pattern: &str, name: &str) -> bool {
    fn m(p: &[char], n: &[char]) -> bool {
        match p.first() {
            None => n.is_empty(),
            Some('*') => (0..=n.len()).any(|i| m(&p[1..], &n[i..])),
            Some('?') => !n.is_empty() && m(&p[1..], &n[1..]),
            Some(c) => n.first() == Some(c) && m(&p[1..], &n[1..]),
        }
    }
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    m(&p, &n)
}

/// The programs one PrologSlurmctld/EpilogSlurmctld value names (Slurm 24.05 allows a
/// comma-separated list and several lines).
pub fn hook_programs(settings: &[Setting]) -> Vec<String> {
    settings
        .iter()
        .flat_map(|s| s.value.split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

/// True when a file name is one the cvslurm binary runs as its hook mode.
pub fn is_hook_name(name: &str) -> bool {
    let base = name.strip_suffix(".py").unwrap_or(name);
    matches!(base, "cvslurm-hook" | "cv-job-hook")
}

/// How a configured hook program reaches cvslurm, or why it does not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HookTarget {
    /// A cvslurm hook name (possibly through symlinks) that resolves to an executable.
    Cvslurm(PathBuf),
    /// A site script that calls a cvslurm hook name.
    SiteScript(PathBuf),
    /// Something else.
    Other(String),
}

/// Follows `program` through its symlinks: it is a cvslurm hook when any name on the way is a
/// hook name and the end is an executable file; a script that mentions a hook name calls it.
pub fn resolve_hook(program: &str) -> HookTarget {
    let mut cur = PathBuf::from(program);
    if !cur.is_absolute() {
        return HookTarget::Other(format!(
            "{program} is not an absolute path (slurmctld runs hooks without a search path)"
        ));
    }
    let mut named_hook = false;
    for _ in 0..40 {
        if cur
            .file_name()
            .is_some_and(|n| is_hook_name(&n.to_string_lossy()))
        {
            named_hook = true;
        }
        match fs::symlink_metadata(&cur) {
            Err(e) => return HookTarget::Other(format!("{}: {e}", cur.display())),
            Ok(m) if m.file_type().is_symlink() => {
                let Ok(next) = fs::read_link(&cur) else {
                    return HookTarget::Other(format!("cannot read symlink {}", cur.display()));
                };
                cur = if next.is_absolute() {
                    next
                } else {
                    cur.parent().unwrap_or(Path::new("/")).join(next)
                };
            }
            Ok(m) => {
                if !m.is_file() || m.mode() & 0o111 == 0 {
                    return HookTarget::Other(format!(
                        "{} is not an executable file",
                        cur.display()
                    ));
                }
                if named_hook {
                    return HookTarget::Cvslurm(cur);
                }
                // A site's own script that ends with a call to cvslurm-hook.
                let text = fs::read(&cur).unwrap_or_default();
                let head = &text[..text.len().min(256 * 1024)];
                if !head.contains(&0) {
                    let s = String::from_utf8_lossy(head);
                    if s.lines()
                        .map(|l| l.split('#').next().unwrap_or(""))
                        .any(|l| l.contains("cvslurm-hook") || l.contains("cv-job-hook"))
                    {
                        return HookTarget::SiteScript(cur);
                    }
                }
                return HookTarget::Other(format!(
                    "{program} is not a cvslurm hook and does not call one"
                ));
            }
        }
    }
    HookTarget::Other(format!("{program}: too many levels of symlinks"))
}

/// Whether a user (uid, gid) may write a file with this metadata; root may always.
pub fn writable_by(meta: &fs::Metadata, uid: u32, gid: u32) -> bool {
    let mode = meta.mode();
    uid == 0
        || (meta.uid() == uid && mode & 0o200 != 0)
        || (meta.gid() == gid && mode & 0o020 != 0)
        || mode & 0o002 != 0
}

/// Whether a user may read a file with this metadata.
pub fn readable_by(meta: &fs::Metadata, uid: u32, gid: u32) -> bool {
    let mode = meta.mode();
    uid == 0
        || (meta.uid() == uid && mode & 0o400 != 0)
        || (meta.gid() == gid && mode & 0o040 != 0)
        || mode & 0o004 != 0
}

struct Report {
    failed: usize,
}

impl Report {
    fn ok(&mut self, what: &str) {
        println!("ok   {what}");
    }
    fn fail(&mut self, what: &str) {
        self.failed += 1;
        println!("FAIL {what}");
    }
}

/// The SlurmUser: name, uid, gid.
struct SlurmUser {
    name: String,
    uid: u32,
    gid: u32,
}

/// Runs every check; returns 0 when all pass, 1 otherwise.
pub fn main(config: Option<&Path>) -> i32 {
    let mut r = Report { failed: 0 };

    // 1. The config file.
    let cfg = match Config::load(config) {
        Ok(c) => {
            match &c.source {
                Some(p) => r.ok(&format!("config {} loads", p.display())),
                None => r.ok(&format!(
                    "config: {} absent, using defaults and the environment",
                    crate::config::DEFAULT_PATH
                )),
            }
            Some(c)
        }
        Err(e) => {
            r.fail(&format!(
                "config: {e}: fix that line (see cloudvision.conf(5))"
            ));
            None
        }
    };

    // 2. slurm.conf: SlurmUser, ClusterName, the hooks.
    let slurm_conf_path = std::env::var_os("SLURM_CONF")
        .filter(|p| !p.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_SLURM_CONF), PathBuf::from);
    let list_dir = |d: &Path| -> Vec<PathBuf> {
        fs::read_dir(d)
            .map(|it| it.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default()
    };
    let slurm_conf = match parse_slurm_conf(
        &slurm_conf_path,
        &|p: &Path| fs::read_to_string(p),
        &list_dir,
    ) {
        Ok(sc) => {
            for p in &sc.problems {
                r.fail(&format!("slurm.conf: {p}: fix or remove that Include line"));
            }
            Some(sc)
        }
        Err(e) => {
            r.fail(&format!(
                "slurm.conf: {e}: set SLURM_CONF to the slurm.conf slurmctld uses"
            ));
            None
        }
    };
    let mut user = None;
    if let Some(sc) = &slurm_conf {
        match sc.last("ClusterName").filter(|s| !s.value.is_empty()) {
            Some(s) => r.ok(&format!("slurm.conf: ClusterName={}", s.value)),
            None => r.fail(&format!(
                "slurm.conf: no ClusterName in {}: set ClusterName= (it is the job's location in CloudVision)",
                slurm_conf_path.display()
            )),
        }
        let name = sc
            .last("SlurmUser")
            .map_or("root".to_string(), |s| s.value.clone());
        match nix::unistd::User::from_name(&name) {
            Ok(Some(u)) => {
                r.ok(&format!(
                    "SlurmUser {name} (uid {}) runs the hook",
                    u.uid.as_raw()
                ));
                user = Some(SlurmUser {
                    name,
                    uid: u.uid.as_raw(),
                    gid: u.gid.as_raw(),
                });
            }
            _ => r.fail(&format!(
                "SlurmUser {name} is not a known user (getent passwd {name}): create it or fix SlurmUser in slurm.conf"
            )),
        }
        for key in ["PrologSlurmctld", "EpilogSlurmctld"] {
            check_hook(&mut r, sc, key);
        }
    }

    let Some(cfg) = cfg else {
        return finish(r);
    };

    // 3. Token.
    let token = match cfg.token() {
        Ok(Some(t)) => {
            match &cfg.api_token {
                Some(_) => r.ok("API token from CV_API_TOKEN"),
                None => {
                    let f = cfg.api_token_file.as_deref().unwrap_or(Path::new("?"));
                    r.ok(&format!("API token file {} is private", f.display()));
                }
            }
            Some(t)
        }
        Ok(None) => {
            r.fail("API token: none configured: set ApiTokenFile in cloudvision.conf (a file of mode 600 owned by SlurmUser)");
            None
        }
        Err(e) => {
            r.fail(&format!("API token: {e}"));
            None
        }
    };
    if let (Some(f), Some(u)) = (&cfg.api_token_file, &user) {
        if let Ok(m) = fs::metadata(f) {
            if readable_by(&m, u.uid, u.gid) {
                r.ok(&format!(
                    "API token file {} is readable by SlurmUser {}",
                    f.display(),
                    u.name
                ));
            } else {
                r.fail(&format!(
                    "API token file {} is not readable by SlurmUser {}: run: chown {} {}",
                    f.display(),
                    u.name,
                    u.name,
                    f.display()
                ));
            }
        }
    }
    if let (Some(src), Some(u)) = (&cfg.source, &user) {
        if let Ok(m) = fs::metadata(src) {
            if !readable_by(&m, u.uid, u.gid) {
                r.fail(&format!(
                    "config {} is not readable by SlurmUser {}: run: chmod 644 {}",
                    src.display(),
                    u.name,
                    src.display()
                ));
            }
        }
    }

    // 4. CloudVision: TLS, reachability and the token.
    match &cfg.api_server {
        None => r.fail("CloudVision: no server configured: set ApiServer in cloudvision.conf"),
        Some(server) => {
            if let Some(ca) = &cfg.ca_file {
                if !ca.exists() {
                    r.fail(&format!(
                        "CaFile {} does not exist: copy the CloudVision CA there or fix CaFile",
                        ca.display()
                    ));
                }
            }
            if cfg.insecure {
                r.ok("TLS verification is OFF (Insecure=yes): set CaFile instead for production");
            }
            if let Some(t) = token {
                let probe = ClientOptions::from_config(&cfg, Some(t), cfg.request_timeout)
                    .and_then(Client::new)
                    .and_then(|c| c.probe(None));
                match probe {
                    Ok(a) => r.ok(&format!(
                        "CloudVision {server} answers with the token (HTTP {}, {} ms)",
                        a.status,
                        a.elapsed.as_millis()
                    )),
                    Err(e) => r.fail(&format!("CloudVision {server}: {e}: {}", probe_hint(&e))),
                }
            } else {
                r.fail(&format!(
                    "CloudVision {server}: not tried without a token: fix the token first"
                ));
            }
        }
    }

    // 5. StateDir and LogFile for SlurmUser.
    if let Some(u) = &user {
        check_dir(&mut r, "StateDir", &cfg.state_dir, u);
        check_log_file(&mut r, &cfg.log_file, u);
    }
    finish(r)
}

fn finish(r: Report) -> i32 {
    if r.failed > 0 {
        println!("{} check(s) failed", r.failed);
        1
    } else {
        println!("all checks passed");
        0
    }
}

fn probe_hint(e: &crate::cloudvision::SendError) -> &'static str {
    use crate::cloudvision::SendError as E;
    match e {
        E::NotConfigured(_) => "fix ApiServer / CaFile in cloudvision.conf",
        E::Unreachable(_) | E::Timeout(_) => {
            "check ApiServer, DNS, the firewall, and CaFile (the CA that signed CloudVision's certificate)"
        }
        E::TokenRefused { .. } => {
            "create a new service-account token with JobConfig/NodeConfig permission and put it in ApiTokenFile"
        }
        E::RateLimited { .. } | E::Server { .. } => "CloudVision is busy or failing; try again later",
        E::Rejected { .. } => "is ApiServer really CloudVision (with the computejob API)?",
    }
}

fn check_hook(r: &mut Report, sc: &SlurmConf, key: &str) {
    let programs = hook_programs(sc.all(key));
    if programs.is_empty() {
        r.fail(&format!(
            "slurm.conf: no {key}: add {key}=/opt/slurm/cloudvision/cvslurm-hook and run scontrol reconfigure (or run install.sh)"
        ));
        return;
    }
    let mut why = Vec::new();
    for p in &programs {
        match resolve_hook(p) {
            HookTarget::Cvslurm(bin) => {
                r.ok(&format!("{key}={p} runs cvslurm ({})", bin.display()));
                return;
            }
            HookTarget::SiteScript(s) => {
                r.ok(&format!(
                    "{key}={p}: site script {} calls cvslurm-hook",
                    s.display()
                ));
                return;
            }
            HookTarget::Other(w) => why.push(w),
        }
    }
    r.fail(&format!(
        "{key}: {}: add the line /opt/slurm/cloudvision/cvslurm-hook at the end of that script (it reads the job from the environment and always exits 0)",
        why.join("; ")
    ));
}

fn check_dir(r: &mut Report, what: &str, dir: &Path, u: &SlurmUser) {
    match fs::metadata(dir) {
        Ok(m) if m.is_dir() => {
            if writable_by(&m, u.uid, u.gid) {
                r.ok(&format!(
                    "{what} {} is writable by SlurmUser {}",
                    dir.display(),
                    u.name
                ));
            } else {
                r.fail(&format!(
                    "{what} {} is not writable by SlurmUser {}: run: chown {} {}",
                    dir.display(),
                    u.name,
                    u.name,
                    dir.display()
                ));
            }
        }
        Ok(_) => r.fail(&format!(
            "{what} {} is not a directory: remove it or point {what} elsewhere",
            dir.display()
        )),
        Err(_) => r.fail(&format!(
            "{what} {} does not exist: run: install -d -o {} -m 0700 {}",
            dir.display(),
            u.name,
            dir.display()
        )),
    }
}

fn check_log_file(r: &mut Report, file: &Path, u: &SlurmUser) {
    match fs::metadata(file) {
        Ok(m) => {
            if writable_by(&m, u.uid, u.gid) {
                r.ok(&format!(
                    "LogFile {} is writable by SlurmUser {}",
                    file.display(),
                    u.name
                ));
            } else {
                r.fail(&format!(
                    "LogFile {} is not writable by SlurmUser {}: run: chown {} {}",
                    file.display(),
                    u.name,
                    u.name,
                    file.display()
                ));
            }
        }
        Err(_) => {
            let dir = file.parent().unwrap_or(Path::new("/"));
            check_dir(r, "LogFile directory", dir, u);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_map(files: &[(&str, &str)], root: &str) -> SlurmConf {
        let map: HashMap<PathBuf, String> = files
            .iter()
            .map(|(p, t)| (PathBuf::from(p), t.to_string()))
            .collect();
        let keys: Vec<PathBuf> = map.keys().cloned().collect();
        let read = move |p: &Path| {
            map.get(p).cloned().ok_or_else(|| {
                std::io::Error::new(std::io::ErrorKind::NotFound, "No such file or directory")
            })
        };
        let list = move |d: &Path| -> Vec<PathBuf> {
            keys.iter()
                .filter(|k| k.parent() == Some(d))
                .cloned()
                .collect()
        };
        parse_slurm_conf(Path::new(root), &read, &list).unwrap()
    }

    #[test]
    fn keys_are_case_insensitive_and_spacing_is_free() {
        let sc = parse_map(
            &[(
                "/etc/slurm/slurm.conf",
                "# comment PrologSlurmctld=/nope\nclustername = cvtest\n  SLURMUSER=slurm   # the user\n\
                 prologslurmctld =  /opt/slurm/cloudvision/cvslurm-hook\nNodeName=n1 CPUs=8\n\
                 EpilogSlurmctld=\"/opt/x y/hook\"\n",
            )],
            "/etc/slurm/slurm.conf",
        );
        assert_eq!(sc.last("ClusterName").unwrap().value, "cvtest");
        assert_eq!(sc.last("slurmuser").unwrap().value, "slurm");
        let p = sc.last("PrologSlurmctld").unwrap();
        assert_eq!(p.value, "/opt/slurm/cloudvision/cvslurm-hook");
        assert_eq!(p.line, 4);
        assert_eq!(sc.last("EpilogSlurmctld").unwrap().value, "/opt/x y/hook");
        assert_eq!(sc.last("NodeName").unwrap().value, "n1");
        assert!(sc.problems.is_empty());
    }

    #[test]
    fn follows_includes_relative_absolute_and_wildcards() {
        let sc = parse_map(
            &[
                (
                    "/etc/slurm/slurm.conf",
                    "ClusterName=a\nInclude hooks.conf\nINCLUDE /etc/slurm/conf.d/*.conf\ninclude \"missing.conf\"\n",
                ),
                (
                    "/etc/slurm/hooks.conf",
                    "PrologSlurmctld=/site/prolog\nClusterName=b\n",
                ),
                ("/etc/slurm/conf.d/10-a.conf", "EpilogSlurmctld=/e1\n"),
                ("/etc/slurm/conf.d/20-b.conf", "EpilogSlurmctld = /e2\n"),
                ("/etc/slurm/conf.d/README", "EpilogSlurmctld=/not-read\n"),
            ],
            "/etc/slurm/slurm.conf",
        );
        let p = sc.last("prologslurmctld").unwrap();
        assert_eq!(p.value, "/site/prolog");
        assert_eq!(p.file, Path::new("/etc/slurm/hooks.conf"));
        assert_eq!(sc.last("ClusterName").unwrap().value, "b");
        let e: Vec<&str> = sc
            .all("EpilogSlurmctld")
            .iter()
            .map(|s| s.value.as_str())
            .collect();
        assert_eq!(e, ["/e1", "/e2"]);
        assert_eq!(sc.problems.len(), 1, "{:?}", sc.problems);
        assert!(sc.problems[0]
            .contains("/etc/slurm/slurm.conf:4: cannot read Include /etc/slurm/missing.conf"));
    }

    #[test]
    fn include_loop_is_reported_not_followed_forever() {
        let sc = parse_map(
            &[
                ("/s/slurm.conf", "Include a.conf\n"),
                ("/s/a.conf", "Include slurm.conf\nClusterName=x\n"),
            ],
            "/s/slurm.conf",
        );
        assert!(sc.problems.iter().any(|p| p.contains("nested more than")));
        assert_eq!(sc.last("ClusterName").unwrap().value, "x");
    }

    #[test]
    fn escaped_hash_and_include_key_value() {
        let sc = parse_map(
            &[("/s/slurm.conf", "ClusterName=a\\#b # c\nInclude=notakey\n")],
            "/s/slurm.conf",
        );
        assert_eq!(sc.last("ClusterName").unwrap().value, "a#b");
        assert_eq!(sc.last("Include").unwrap().value, "notakey");
    }

    #[test]
    fn hook_lists_and_names() {
        let s = |v: &str| Setting {
            value: v.into(),
            file: PathBuf::from("/x"),
            line: 1,
        };
        assert_eq!(hook_programs(&[s("/a, /b"), s("/c")]), ["/a", "/b", "/c"]);
        for n in ["cvslurm-hook", "cv-job-hook", "cv-job-hook.py"] {
            assert!(is_hook_name(n), "{n}");
        }
        for n in ["cvslurm", "cvslurm-send", "prolog.sh"] {
            assert!(!is_hook_name(n), "{n}");
        }
        assert!(wildcard_match("*.conf", "a.conf"));
        assert!(!wildcard_match("*.conf", "README"));
        assert!(wildcard_match("?b*", "ab"));
    }

    #[test]
    fn resolves_hook_symlinks_and_site_scripts() {
        use std::os::unix::fs::{symlink, PermissionsExt};
        let dir = std::env::temp_dir().join(format!("cvslurm-check-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let bin = dir.join("cvslurm");
        fs::write(&bin, b"\x7fELF\0").unwrap();
        fs::set_permissions(&bin, fs::Permissions::from_mode(0o755)).unwrap();
        symlink("cvslurm", dir.join("cvslurm-hook")).unwrap();
        symlink(dir.join("cvslurm-hook"), dir.join("site-prolog")).unwrap();
        let script = dir.join("prolog.sh");
        fs::write(
            &script,
            "#!/bin/sh\n/usr/local/bin/x\n/opt/slurm/cloudvision/cvslurm-hook\n",
        )
        .unwrap();
        fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
        let other = dir.join("other.sh");
        fs::write(&other, "#!/bin/sh\n# cvslurm-hook is not called\nexit 0\n").unwrap();
        fs::set_permissions(&other, fs::Permissions::from_mode(0o755)).unwrap();
        let s = |p: &Path| p.to_str().unwrap().to_string();
        assert_eq!(
            resolve_hook(&s(&dir.join("cvslurm-hook"))),
            HookTarget::Cvslurm(bin.clone())
        );
        assert_eq!(
            resolve_hook(&s(&dir.join("site-prolog"))),
            HookTarget::Cvslurm(bin.clone())
        );
        assert_eq!(
            resolve_hook(&s(&script)),
            HookTarget::SiteScript(script.clone())
        );
        assert!(matches!(resolve_hook(&s(&other)), HookTarget::Other(_)));
        assert!(matches!(resolve_hook(&s(&bin)), HookTarget::Other(_)));
        assert!(matches!(resolve_hook("cvslurm-hook"), HookTarget::Other(_)));
        assert!(matches!(
            resolve_hook(&s(&dir.join("gone"))),
            HookTarget::Other(_)
        ));
        fs::remove_dir_all(&dir).unwrap();
    }
}
