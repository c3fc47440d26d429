//! `cvslurm check --slurm-facts`: what install.sh needs to know about slurm.conf and Slurm, as
//! `key=value` lines, read with the same slurm.conf parser ([`crate::slurm::conf`]) and version
//! reader ([`crate::slurm::version`]) the binary itself uses, so the installer parses nothing.
//!
//! Lines (values run to the end of the line):
//! - `slurm_conf=PATH`, `cluster_name=NAME` (empty: none), `slurm_user=USER` (default root);
//! - `slurm_version=MAJOR.MINOR.MICRO` (empty: unknown) and `several_hooks=yes|no` (Slurm
//!   24.05 and later run every PrologSlurmctld/EpilogSlurmctld line);
//! - for `PrologSlurmctld` and `EpilogSlurmctld`: `KEY=VALUE`, the value slurmctld uses (the
//!   last line not added by install.sh), then one `KEY.program=KIND PROGRAM` per program the
//!   key's lines name, KIND being `ours` (the hook install.sh installs, or a link to the same
//!   file), `calls` (a script whose code names a cvslurm hook link), or `other`;
//! - `controller=NAME this|other` for each `SlurmctldHost`, in slurm.conf's order: whether it
//!   is this host as slurmctld decides it (its short or full host name, or `localhost`);
//! - `in_control=NAME` with two or more: the controller Slurm's heartbeat names
//!   ([`crate::slurm::leader`]); empty when it cannot be told;
//! - `problem=TEXT` for each slurm.conf line that could not be read (an Include).
//!
//! Lines install.sh added (ending with [`INSTALL_MARK`]) are left out: it rebuilds them.

use crate::slurm::conf::{hook_programs, Setting, SlurmConf};
use std::path::Path;

/// The comment install.sh ends the slurm.conf lines it adds with.
pub const INSTALL_MARK: &str = "# added by cvslurm install.sh";

/// The hook keys install.sh manages.
pub const HOOK_KEYS: [&str; 2] = ["PrologSlurmctld", "EpilogSlurmctld"];

/// The facts about `conf` (read from `conf_path`) as `key=value` lines; `version` is Slurm's
/// version when known, `hook` the path install.sh installs the hook at.
pub fn facts(
    conf_path: &Path,
    conf: &SlurmConf,
    version: Option<crate::slurm::Version>,
    hook: Option<&Path>,
) -> String {
    let mut out = String::new();
    let mut put = |k: &str, v: &str| {
        // A value is one line: a newline in a file name must not forge another fact.
        out.push_str(&format!("{k}={}\n", v.replace(['\n', '\r'], "?")));
    };
    put("slurm_conf", &conf_path.display().to_string());
    let last = |k: &str| conf.last(k).map_or(String::new(), |s| s.value.clone());
    put("cluster_name", &last("ClusterName"));
    let user = last("SlurmUser");
    put("slurm_user", if user.is_empty() { "root" } else { &user });
    put(
        "slurm_version",
        &version.map_or(String::new(), |v| v.to_string()),
    );
    let several = version.is_some_and(|v| (v.major, v.minor) >= (24, 5));
    put("several_hooks", if several { "yes" } else { "no" });
    for key in HOOK_KEYS {
        let settings: Vec<Setting> = conf
            .all(key)
            .iter()
            .filter(|s| !marked(s))
            .cloned()
            .collect();
        put(key, settings.last().map_or("", |s| s.value.as_str()));
        for program in hook_programs(&settings) {
            let kind = if is_ours(&program, hook) {
                "ours"
            } else if calls_a_hook(Path::new(&program)) {
                "calls"
            } else {
                "other"
            };
            put(&format!("{key}.program"), &format!("{kind} {program}"));
        }
    }
    let hostname = crate::slurm::leader::this_hostname();
    for c in crate::slurm::leader::controllers(conf) {
        let whose = if crate::slurm::leader::is_this_host(&c, &hostname) {
            "this"
        } else {
            "other"
        };
        put("controller", &format!("{} {whose}", c.name));
    }
    if crate::slurm::leader::controllers(conf).len() > 1 {
        let now = u64::try_from(crate::timefmt::now_epoch()).unwrap_or(0);
        let name = match crate::slurm::leader::leader(conf, now) {
            crate::slurm::leader::Leader::InControl { name, .. } => name,
            crate::slurm::leader::Leader::Unknown(_) => String::new(),
        };
        put("in_control", &name);
    }
    for p in &conf.problems {
        put("problem", p);
    }
    out
}

/// Whether the line a setting came from is one install.sh added.
fn marked(s: &Setting) -> bool {
    std::fs::read_to_string(&s.file).is_ok_and(|t| {
        t.lines()
            .nth(s.line - 1)
            .is_some_and(|l| l.trim_end().ends_with(INSTALL_MARK))
    })
}

/// `program` is the hook install.sh installs: that path, or a hook link name leading to the
/// same file.
fn is_ours(program: &str, hook: Option<&Path>) -> bool {
    let Some(hook) = hook else { return false };
    if Path::new(program) == hook {
        return true;
    }
    let name = Path::new(program)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if !crate::link_names::is_hook_name(&name) {
        return false;
    }
    match (std::fs::canonicalize(program), std::fs::canonicalize(hook)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// A site script whose code (comment lines aside) names a hook link (`cvslurm-hook`, ...):
/// the line its administrator added to call cvslurm, which may not be installed yet.
fn calls_a_hook(path: &Path) -> bool {
    let Ok(meta) = std::fs::metadata(path) else {
        return false;
    };
    if !meta.is_file() || meta.len() > 16 * 1024 * 1024 {
        return false;
    }
    let Ok(bytes) = std::fs::read(path) else {
        return false;
    };
    let text = String::from_utf8_lossy(&bytes);
    let hook_names: Vec<&str> = crate::link_names::MODES
        .iter()
        .filter(|(m, _)| *m == "hook")
        .flat_map(|(_, names)| names.iter().copied())
        .collect();
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .any(|l| hook_names.iter().any(|n| l.contains(n)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn facts_name_the_hooks_and_leave_out_our_marked_lines() {
        let dir = std::env::temp_dir().join(format!("cvslurm-facts-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("opt")).unwrap();
        let hook = dir.join("opt/cvslurm-hook");
        fs::write(&hook, "").unwrap();
        std::os::unix::fs::symlink(&hook, dir.join("cv-job-hook")).unwrap();
        let calls = dir.join("site-prolog.sh");
        fs::write(
            &calls,
            format!("#!/bin/sh\n# cvslurm-hook later\n\"{}\"\n", hook.display()),
        )
        .unwrap();
        let other = dir.join("site-epilog.sh");
        fs::write(&other, "#!/bin/sh\n# cvslurm-hook is not called\nexit 0\n").unwrap();
        let conf = dir.join("slurm.conf");
        fs::write(
            &conf,
            format!(
                "ClusterName=c1\nSlurmUser=slurm\nPrologSlurmctld={}\nEpilogSlurmctld={},{}\n\
                 EpilogSlurmctld={}  {INSTALL_MARK}\n",
                calls.display(),
                other.display(),
                dir.join("cv-job-hook").display(),
                hook.display(),
            ),
        )
        .unwrap();
        let sc = crate::slurm::conf::load_slurm_conf(&conf).unwrap();
        let v = crate::slurm::Version::parse("slurm 24.05.1");
        let text = facts(&conf, &sc, v, Some(&hook));
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines.contains(&"cluster_name=c1"), "{text}");
        assert!(lines.contains(&"slurm_user=slurm"), "{text}");
        assert!(lines.contains(&"slurm_version=24.05.1"), "{text}");
        assert!(lines.contains(&"several_hooks=yes"), "{text}");
        let want = [
            format!("PrologSlurmctld.program=calls {}", calls.display()),
            format!(
                "EpilogSlurmctld={},{}",
                other.display(),
                dir.join("cv-job-hook").display()
            ),
            format!("EpilogSlurmctld.program=other {}", other.display()),
            format!(
                "EpilogSlurmctld.program=ours {}",
                dir.join("cv-job-hook").display()
            ),
        ];
        for w in &want {
            assert!(lines.contains(&w.as_str()), "{w} not in\n{text}");
        }
        assert_eq!(
            lines
                .iter()
                .filter(|l| l.starts_with("EpilogSlurmctld.program="))
                .count(),
            2,
            "the marked line is left out:\n{text}"
        );
        let old = facts(
            &conf,
            &sc,
            crate::slurm::Version::parse("slurm 22.05.8"),
            None,
        );
        assert!(
            old.contains("several_hooks=no\n") && !old.contains("=ours "),
            "{old}"
        );
        let unknown = facts(&conf, &sc, None, None);
        assert!(
            unknown.contains("slurm_version=\nseveral_hooks=no\n"),
            "{unknown}"
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    /// Each `SlurmctldHost` is a `controller` line, this host's marked `this`; a newline in a
    /// name cannot forge another fact.
    #[test]
    fn facts_name_every_controller_and_this_host() {
        let me = nix::unistd::gethostname()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let short = me.split('.').next().unwrap().to_string();
        let text =
            format!("ClusterName=c1\nSlurmctldHost=ctl-other(10.0.0.2)\nSlurmctldHost={short}\n");
        let sc = crate::slurm::conf::parse_slurm_conf(
            Path::new("/etc/slurm/slurm.conf"),
            &move |_| Ok(text.clone()),
            &|_| Vec::new(),
        )
        .unwrap();
        let out = facts(Path::new("/etc/slurm/slurm.conf"), &sc, None, None);
        let lines: Vec<&str> = out
            .lines()
            .filter(|l| l.starts_with("controller="))
            .collect();
        let this = format!("controller={short} this");
        assert_eq!(
            lines,
            ["controller=ctl-other other", this.as_str()],
            "{out}"
        );
    }
}
