//! `cvslurm check`: is this machine set up right? One line per check, `ok   …` or
//! `FAIL …: what to do`; exit 1 when any check fails.
//!
//! Checks, in order: the config file loads; a server and a token are configured and the token
//! file is private and readable by SlurmUser; CloudVision answers over TLS with the token;
//! slurm.conf (with its `Include`s) runs a cvslurm hook as PrologSlurmctld and
//! EpilogSlurmctld; SlurmUser can write StateDir and LogFile.

use crate::cloudvision::{Client, ClientOptions};
use crate::config::{Config, Token};
use crate::slurm_conf::{hook_programs, parse_slurm_conf, SlurmConf, DEFAULT_SLURM_CONF};
use argh::FromArgs;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

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

/// What the checks learn and later checks build on.
#[derive(Default)]
struct Context {
    /// `--config`.
    config_arg: Option<PathBuf>,
    /// The config, once it loaded.
    cfg: Option<Config>,
    /// Where slurm.conf is.
    slurm_conf_path: PathBuf,
    /// slurm.conf, once it parsed.
    slurm_conf: Option<SlurmConf>,
    /// The SlurmUser, once known.
    user: Option<SlurmUser>,
    /// The API token, once it read.
    token: Option<Token>,
}

/// One check: looks at the context (and the machine), prints its lines into the report.
type Check = fn(&mut Context, &mut Report);

/// Every check, in the order they run and print.
const CHECKS: &[Check] = &[
    config_loads,
    slurm_conf_parses,
    cluster_name,
    slurm_user,
    hooks,
    slurm_release,
    token,
    token_file_readable,
    config_readable,
    cloudvision,
    state_dir,
    log_file,
];

/// Check the set-up: config, token, CloudVision, slurm.conf hooks, StateDir and LogFile.
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "check", help_triggers("-h", "--help", "help"))]
pub struct Args {
    /// config file (default $CVSLURM_CONF or /etc/slurm/cloudvision.conf)
    #[argh(option)]
    config: Option<PathBuf>,
}

/// Runs every check; returns 0 when all pass, 1 otherwise.
pub fn run(a: Args) -> i32 {
    let mut ctx = Context {
        config_arg: a.config,
        slurm_conf_path: std::env::var_os("SLURM_CONF")
            .filter(|p| !p.is_empty())
            .map_or_else(|| PathBuf::from(DEFAULT_SLURM_CONF), PathBuf::from),
        ..Context::default()
    };
    let mut r = Report { failed: 0 };
    for check in CHECKS {
        check(&mut ctx, &mut r);
    }
    finish(r)
}

fn config_loads(ctx: &mut Context, r: &mut Report) {
    match Config::load(ctx.config_arg.as_deref()) {
        Ok(c) => {
            match &c.source {
                Some(p) => r.ok(&format!("config {} loads", p.display())),
                None => r.ok(&format!(
                    "config: {} absent, using defaults and the environment",
                    crate::config::DEFAULT_PATH
                )),
            }
            ctx.cfg = Some(c);
        }
        Err(e) => r.fail(&format!(
            "config: {e}: fix that line (see cloudvision.conf(5))"
        )),
    }
}

fn slurm_conf_parses(ctx: &mut Context, r: &mut Report) {
    let list_dir = |d: &Path| -> Vec<PathBuf> {
        fs::read_dir(d)
            .map(|it| it.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default()
    };
    match parse_slurm_conf(
        &ctx.slurm_conf_path,
        &|p: &Path| fs::read_to_string(p),
        &list_dir,
    ) {
        Ok(sc) => {
            for p in &sc.problems {
                r.fail(&format!("slurm.conf: {p}: fix or remove that Include line"));
            }
            ctx.slurm_conf = Some(sc);
        }
        Err(e) => r.fail(&format!(
            "slurm.conf: {e}: set SLURM_CONF to the slurm.conf slurmctld uses"
        )),
    }
}

fn cluster_name(ctx: &mut Context, r: &mut Report) {
    let Some(sc) = &ctx.slurm_conf else { return };
    match sc.last("ClusterName").filter(|s| !s.value.is_empty()) {
        Some(s) => r.ok(&format!("slurm.conf: ClusterName={}", s.value)),
        None => r.fail(&format!(
            "slurm.conf: no ClusterName in {}: set ClusterName= (it is the job's location in CloudVision)",
            ctx.slurm_conf_path.display()
        )),
    }
}

fn slurm_user(ctx: &mut Context, r: &mut Report) {
    let Some(sc) = &ctx.slurm_conf else { return };
    let name = sc
        .last("SlurmUser")
        .map_or("root".to_string(), |s| s.value.clone());
    match nix::unistd::User::from_name(&name) {
        Ok(Some(u)) => {
            r.ok(&format!(
                "SlurmUser {name} (uid {}) runs the hook",
                u.uid.as_raw()
            ));
            ctx.user = Some(SlurmUser {
                name,
                uid: u.uid.as_raw(),
                gid: u.gid.as_raw(),
            });
        }
        _ => r.fail(&format!(
            "SlurmUser {name} is not a known user (getent passwd {name}): create it or fix SlurmUser in slurm.conf"
        )),
    }
}

fn hooks(ctx: &mut Context, r: &mut Report) {
    let Some(sc) = &ctx.slurm_conf else { return };
    for key in ["PrologSlurmctld", "EpilogSlurmctld"] {
        check_hook(r, sc, key);
    }
}

/// The Slurm release (`scontrol --version`), and the commands cvslurm reads it with.
fn slurm_release(ctx: &mut Context, r: &mut Report) {
    let Some(cfg) = &ctx.cfg else { return };
    let slurm = crate::runner::Slurm::new(cfg.slurm_bin_dir.as_deref());
    match crate::slurm::version(&slurm) {
        Ok(v) => r.ok(&format!("Slurm {v}: {}", v.reader().describe())),
        Err(e) => r.fail(&format!(
            "Slurm: cannot tell its version ({e}): check that scontrol works here (slurm.conf, munge) or set SlurmBinDir"
        )),
    }
}

fn token(ctx: &mut Context, r: &mut Report) {
    let Some(cfg) = &ctx.cfg else { return };
    match cfg.token() {
        Ok(Some(t)) => {
            match &cfg.api_token {
                Some(_) => r.ok("API token from CV_API_TOKEN"),
                None => {
                    let f = cfg.api_token_file.as_deref().unwrap_or(Path::new("?"));
                    r.ok(&format!("API token file {} is private", f.display()));
                }
            }
            ctx.token = Some(t);
        }
        Ok(None) => r.fail("API token: none configured: set ApiTokenFile in cloudvision.conf (a file of mode 600 owned by SlurmUser)"),
        Err(e) => r.fail(&format!("API token: {e}")),
    }
}

fn token_file_readable(ctx: &mut Context, r: &mut Report) {
    let (Some(cfg), Some(u)) = (&ctx.cfg, &ctx.user) else {
        return;
    };
    let Some(f) = &cfg.api_token_file else { return };
    let Ok(m) = fs::metadata(f) else { return };
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

fn config_readable(ctx: &mut Context, r: &mut Report) {
    let (Some(cfg), Some(u)) = (&ctx.cfg, &ctx.user) else {
        return;
    };
    let Some(src) = &cfg.source else { return };
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

/// CloudVision: TLS, reachability and the token.
fn cloudvision(ctx: &mut Context, r: &mut Report) {
    let Some(cfg) = &ctx.cfg else { return };
    let Some(server) = &cfg.api_server else {
        r.fail("CloudVision: no server configured: set ApiServer in cloudvision.conf");
        return;
    };
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
    let Some(t) = ctx.token.clone() else {
        r.fail(&format!(
            "CloudVision {server}: not tried without a token: fix the token first"
        ));
        return;
    };
    let probe = ClientOptions::from_config(cfg, Some(t), cfg.request_timeout)
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
}

fn state_dir(ctx: &mut Context, r: &mut Report) {
    if let (Some(cfg), Some(u)) = (&ctx.cfg, &ctx.user) {
        check_dir(r, "StateDir", &cfg.state_dir, u);
    }
}

fn log_file(ctx: &mut Context, r: &mut Report) {
    if let (Some(cfg), Some(u)) = (&ctx.cfg, &ctx.user) {
        check_log_file(r, &cfg.log_file, u);
    }
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
    use crate::slurm_conf::Setting;

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
