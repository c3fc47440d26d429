//! slurm.conf as slurmctld reads it: `Key=Value` settings, case-insensitive keys, comments,
//! and `Include` lines (relative, absolute, wildcards), with where each setting came from.

use std::collections::HashMap;
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

/// slurm.conf's path: `$SLURM_CONF` (when set and not empty), else [`DEFAULT_SLURM_CONF`].
pub fn slurm_conf_path() -> PathBuf {
    std::env::var_os("SLURM_CONF")
        .filter(|p| !p.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_SLURM_CONF), PathBuf::from)
}

/// The slurm.conf that `scontrol show config` names (its `SLURM_CONF = PATH` line): the path
/// when it is absolute, else `None`.
pub fn path_from_show_config(text: &str) -> Option<PathBuf> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once('=')?;
        let p = PathBuf::from(v.trim());
        (k.trim() == "SLURM_CONF" && p.is_absolute()).then_some(p)
    })
}

/// Reads slurm.conf at `path` from the file system, `Include`s followed.
pub fn load_slurm_conf(path: &Path) -> Result<SlurmConf, String> {
    let list_dir = |d: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(d)
            .map(|it| it.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default()
    };
    parse_slurm_conf(path, &|p: &Path| std::fs::read_to_string(p), &list_dir)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// As 24.11's `scontrol show config` prints it (measured on the test cluster).
    #[test]
    fn slurm_conf_from_show_config() {
        let text = "Configuration data as of 2026-12-03T15:34:32\nBOOT_TIME               = 2026-12-03T15:34:29\nPrologSlurmctld[0]      = /bin/true\nSLURM_CONF              = /usr/local/etc/slurm.conf\nSrunProlog              = (null)\n";
        assert_eq!(
            path_from_show_config(text),
            Some(PathBuf::from("/usr/local/etc/slurm.conf"))
        );
        assert_eq!(path_from_show_config("SLURM_CONF = slurm.conf\n"), None);
        assert_eq!(
            path_from_show_config("SLURM_CONF_X = /x\nClusterName = a\n"),
            None
        );
        assert_eq!(path_from_show_config(""), None);
    }

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
    fn wildcards() {
        assert!(wildcard_match("*.conf", "a.conf"));
        assert!(!wildcard_match("*.conf", "README"));
        assert!(wildcard_match("?b*", "ab"));
    }
}
