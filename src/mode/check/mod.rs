//! `cvslurm check`: is this machine set up right? One line per check, `ok   …` or
//! `FAIL …: what to do`; exit 1 when any check fails.
//!
//! Checks, in order: the config file loads; a server and a token are configured and the token
//! file is private and readable by SlurmUser; CloudVision answers over TLS with the token;
//! slurm.conf (with its `Include`s) runs a cvslurm hook as PrologSlurmctld and
//! EpilogSlurmctld; SlurmUser can write StateDir and LogFile.

pub mod contract;
pub mod slurm_facts;

use super::startup::client_for;
use crate::config::{Config, Token};
use crate::link_names::is_hook_name;
use crate::slurm::conf::{hook_programs, SlurmConf};
use crate::text::escape_control;
use argh::FromArgs;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// How a configured hook program reaches cvslurm, or why it does not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HookTarget {
    /// Called by a hook name, the program is (through any symlinks) a cvslurm binary: this
    /// very binary (`true`, same file or same bytes) or another cvslurm build (`false`).
    Cvslurm(PathBuf, bool),
    /// A site script that calls a cvslurm hook (checked the same way).
    SiteScript(PathBuf),
    /// Something else, and why.
    Other(String),
}

/// What a file really is.
enum Identity {
    /// The binary running this check (same inode or same bytes).
    ThisBinary,
    /// Another build of cvslurm (an ELF file with cvslurm's hook and API strings).
    OtherCvslurm,
    /// A script (text), with its first 256 KiB.
    Script(String),
    /// Any other executable.
    OtherBinary,
}

fn identify(path: &Path) -> Identity {
    use std::os::unix::fs::MetadataExt;
    let me = std::env::current_exe().ok();
    if let (Some(me), Ok(a)) = (&me, fs::metadata(path)) {
        if let Ok(b) = fs::metadata(me) {
            if (a.dev(), a.ino()) == (b.dev(), b.ino()) {
                return Identity::ThisBinary;
            }
        }
    }
    // The first 64 MiB of a file, at most (a debug build is larger: its copies compare
    // equal when their sizes and their first 64 MiB do).
    let head_of = |p: &Path| {
        let mut text = Vec::new();
        if let Ok(f) = fs::File::open(p) {
            use std::io::Read;
            let _ = f.take(64 * 1024 * 1024).read_to_end(&mut text);
        }
        text
    };
    let text = head_of(path);
    if text.starts_with(b"\x7fELF") {
        let size = |p: &Path| fs::metadata(p).map(|m| m.len()).ok();
        if me
            .as_deref()
            .is_some_and(|m| size(m) == size(path) && head_of(m) == text)
        {
            return Identity::ThisBinary;
        }
        let has = |needle: &[u8]| text.windows(needle.len()).any(|w| w == needle);
        if has(b"cvslurm-hook") && has(crate::cloudvision::JOB_CONFIG_PATH.as_bytes()) {
            return Identity::OtherCvslurm;
        }
        return Identity::OtherBinary;
    }
    let head = &text[..text.len().min(256 * 1024)];
    if head.contains(&0) {
        return Identity::OtherBinary;
    }
    Identity::Script(String::from_utf8_lossy(head).into_owned())
}

/// Checks what `program` really is: the path's own name must select the hook mode (argv[0]
/// is how cvslurm knows), and the file it leads to, through any symlinks, must be a cvslurm
/// binary — compared with the running one by inode or content — or a script that calls one.
/// A file name alone proves nothing (the Python reference is also `cv-job-hook.py`).
pub fn resolve_hook(program: &str) -> HookTarget {
    resolve_hook_at(program, 0)
}

fn resolve_hook_at(program: &str, depth: usize) -> HookTarget {
    let path = Path::new(program);
    if !path.is_absolute() {
        return HookTarget::Other(format!(
            "{program} is not an absolute path (slurmctld runs hooks without a search path)"
        ));
    }
    let target = match fs::canonicalize(path) {
        Ok(t) => t,
        Err(e) => return HookTarget::Other(format!("{program}: {e}")),
    };
    match fs::metadata(&target) {
        Ok(m) if m.is_file() && m.mode() & 0o111 != 0 => {}
        _ => return HookTarget::Other(format!("{} is not an executable file", target.display())),
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let shown = if target == path {
        program.to_string()
    } else {
        format!("{program} (-> {})", target.display())
    };
    let is_cvslurm = |this: bool| {
        if is_hook_name(&name) {
            HookTarget::Cvslurm(target.clone(), this)
        } else {
            HookTarget::Other(format!(
                "{shown} is cvslurm under the name {name:?}, which selects no mode: it would exit 2 and fail every job; use a link named cvslurm-hook"
            ))
        }
    };
    match identify(&target) {
        Identity::ThisBinary => is_cvslurm(true),
        Identity::OtherCvslurm => is_cvslurm(false),
        Identity::OtherBinary => {
            HookTarget::Other(format!("{shown} is an executable that is not cvslurm"))
        }
        Identity::Script(text) => {
            if depth < 4 {
                for line in text.lines().map(|l| l.split('#').next().unwrap_or("")) {
                    let words: Vec<&str> = line
                        .split(|c: char| c.is_whitespace() || "'\";&|()`".contains(c))
                        .filter(|w| !w.is_empty())
                        .collect();
                    for (i, w) in words.iter().enumerate() {
                        let base = Path::new(w).file_name().map(|n| n.to_string_lossy());
                        let calls = match base.as_deref() {
                            Some(b) if is_hook_name(b) => resolve_hook_at(w, depth + 1),
                            // `/opt/slurm/cloudvision/cvslurm hook`
                            Some("cvslurm") if words.get(i + 1) == Some(&"hook") => {
                                match identify(Path::new(w)) {
                                    Identity::ThisBinary | Identity::OtherCvslurm => {
                                        HookTarget::Cvslurm(PathBuf::from(w), true)
                                    }
                                    _ => HookTarget::Other(String::new()),
                                }
                            }
                            _ => continue,
                        };
                        if matches!(calls, HookTarget::Cvslurm(..)) {
                            return HookTarget::SiteScript(target.clone());
                        }
                    }
                }
            }
            let python = text
                .lines()
                .next()
                .is_some_and(|l| l.starts_with("#!") && l.contains("python"));
            HookTarget::Other(format!(
                "{shown} is a {} that does not call cvslurm-hook{}",
                if python { "Python script" } else { "script" },
                if python {
                    " (the Python reference hook? replace it by /opt/slurm/cloudvision/cvslurm-hook)"
                } else {
                    ""
                }
            ))
        }
    }
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

/// Every line is one line on the terminal: what it quotes (a server's message, a config
/// value, a path) has its control characters escaped.
impl Report {
    fn ok(&mut self, what: &str) {
        println!("ok   {}", escape_control(what));
    }
    fn fail(&mut self, what: &str) {
        self.failed += 1;
        println!("FAIL {}", escape_control(what));
    }
    /// Something that works but costs: printed, not counted as a failure.
    fn warn(&mut self, what: &str) {
        println!("WARN {}", escape_control(what));
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
    controllers,
    hooks_loaded,
    slurm_release,
    token,
    token_file_readable,
    config_readable,
    cloudvision,
    jobcomp_forward,
    worker_records,
    state_dir,
    log_file,
    delivery_path,
];

/// The long flags of `cvslurm check` (`--help` aside), for `cvslurm --list-flags check`, the
/// completion and the documentation tests; a unit test in [`crate::cli`] holds it to [`Args`].
pub const FLAGS: &[&str] = &[
    "--config",
    "--contract",
    "--slurm-facts",
    "--hook",
    "--slurm-version",
];

/// Check the set-up: config, token, CloudVision, slurm.conf hooks, StateDir and LogFile.
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "check", help_triggers("-h", "--help", "help"))]
pub struct Args {
    /// config file (default $CVSLURM_CONF or /etc/slurm/cloudvision.conf)
    #[argh(option)]
    config: Option<PathBuf>,
    /// WRITES to CloudVision: asks it the questions of README's "CloudVision compatibility"
    /// with throw-away records (deleted at the end) and says whether cvslurm's assumptions
    /// hold (exit 0), do not (1), or could not all be asked and answered (2: also a server
    /// that takes the writes but answers no GetOne as CloudVision)
    #[argh(switch)]
    contract: bool,
    /// print what install.sh needs to know about slurm.conf and Slurm as key=value lines
    /// (see crate::mode::check::slurm_facts) instead of checking
    #[argh(switch)]
    slurm_facts: bool,
    /// with --slurm-facts: the hook path to tell apart as "ours"
    #[argh(option)]
    hook: Option<PathBuf>,
    /// with --slurm-facts: this Slurm version (MAJOR.MINOR) instead of asking scontrol
    #[argh(option)]
    slurm_version: Option<String>,
}

/// Runs every check; returns 0 when all pass, 1 otherwise.
pub fn run(a: Args) -> i32 {
    if a.slurm_facts {
        return slurm_facts(&a);
    }
    if a.contract {
        return contract(&a);
    }
    let mut ctx = Context {
        config_arg: a.config,
        slurm_conf_path: crate::slurm::conf::slurm_conf_path(),
        ..Context::default()
    };
    let mut r = Report { failed: 0 };
    for check in CHECKS {
        check(&mut ctx, &mut r);
    }
    finish(r)
}

/// `--contract`: the questions of [`contract`](mod@contract) against the configured
/// CloudVision, the throw-away keys qualified by slurm.conf's ClusterName (else `no-cluster`).
fn contract(a: &Args) -> i32 {
    use super::startup::{ClientNeed, Options, StartError, Startup};
    let startup = Startup {
        options: Options {
            config: a.config.clone(),
            ..Options::default()
        },
        log: None,
        client: ClientNeed::Required,
        drop_privileges: false,
    };
    let started = startup.start();
    let client = match started
        .as_ref()
        .map_err(Clone::clone)
        .and_then(|s| s.client())
    {
        Ok(Some(c)) => c,
        Ok(None) => unreachable!("a client is required"),
        Err(StartError::Failed(m)) => {
            println!(
                "FAIL {}: nothing was written; run cvslurm check",
                escape_control(&m)
            );
            return crate::mode::check::contract::EXIT_COULD_NOT_RUN;
        }
        Err(e) => {
            e.report();
            return crate::mode::check::contract::EXIT_COULD_NOT_RUN;
        }
    };
    let cluster = crate::slurm::conf::load_slurm_conf(&crate::slurm::conf::slurm_conf_path())
        .ok()
        .and_then(|sc| sc.last("ClusterName").map(|s| s.value.clone()))
        .filter(|c| {
            !c.is_empty()
                && c.chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || "-_.".contains(ch))
        })
        .unwrap_or_else(|| "no-cluster".to_string());
    let cfg = &started.as_ref().expect("started").cfg;
    let mut curl = match &cfg.api_token_file {
        Some(f) => format!("-H \"Authorization: Bearer $(cat {})\"", f.display()),
        None => "-H \"Authorization: Bearer $TOKEN\"".to_string(),
    };
    if cfg.insecure {
        curl.push_str(" --insecure");
    } else if let Some(ca) = &cfg.ca_file {
        curl.push_str(&format!(" --cacert {}", ca.display()));
    }
    // Question 5 (a NodeConfig hostname other than its key.id) only where cvslurm sends one.
    let mut hostname_settings = Vec::new();
    if cfg.node_hostname == crate::config::NodeHostname::HostName {
        hostname_settings.push("NodeHostname=hostname");
    }
    if cfg.qualify_node_names {
        hostname_settings.push("QualifyNodeNames=yes");
    }
    crate::mode::check::contract::run(&client, &cluster, &curl, &hostname_settings)
}

/// `--slurm-facts`: exit 0 with the facts, 1 when slurm.conf cannot be read.
fn slurm_facts(a: &Args) -> i32 {
    let path = crate::slurm::conf::slurm_conf_path();
    let sc = match crate::slurm::conf::load_slurm_conf(&path) {
        Ok(sc) => sc,
        Err(e) => {
            eprintln!("cvslurm: slurm.conf: {e}: set SLURM_CONF to the slurm.conf slurmctld uses");
            return 1;
        }
    };
    let version = match &a.slurm_version {
        Some(v) => match crate::slurm::Version::parse(v) {
            Some(v) => Some(v),
            None => {
                eprintln!("cvslurm: --slurm-version {v:?} is not a Slurm version such as 24.05");
                return 2;
            }
        },
        None => {
            let bin_dir = Config::load(a.config.as_deref())
                .ok()
                .and_then(|c| c.slurm_bin_dir);
            crate::slurm::version(&crate::slurm::runner::Slurm::new(bin_dir.as_deref())).ok()
        }
    };
    print!(
        "{}",
        crate::mode::check::slurm_facts::facts(&path, &sc, version, a.hook.as_deref())
    );
    0
}

fn config_loads(ctx: &mut Context, r: &mut Report) {
    match Config::load(ctx.config_arg.as_deref()) {
        Ok(c) => {
            for p in &c.problems {
                r.fail(&format!(
                    "config: {p}: fix that line (see cloudvision.conf(5)); the hook and the service ignore it and use the others"
                ));
            }
            match &c.source {
                Some(p) if !c.problems.is_empty() => {
                    r.ok(&format!("config {}: every other line loads", p.display()))
                }
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
    match crate::slurm::conf::load_slurm_conf(&ctx.slurm_conf_path) {
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

/// How long `check` waits for the `JobCompForward` target.
const FORWARD_PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// `JobCompForward`: the target, whether it answers a `GET` of its base (within
/// [`FORWARD_PROBE_TIMEOUT`]), and the spool. Not answering is a warning: the documents wait
/// in the spool, and cvslurm's own ends do not depend on it.
fn jobcomp_forward(ctx: &mut Context, r: &mut Report) {
    let Some(cfg) = &ctx.cfg else { return };
    let Some(target) = &cfg.jobcomp_forward else {
        return;
    };
    if cfg.jobcomp_port == 0 {
        r.warn(&format!(
            "JobCompForward={} but JobCompPort=0: no receiver, so nothing is forwarded; set JobCompPort (install.sh --jobcomp) or remove JobCompForward",
            target.shown()
        ));
        return;
    }
    let spool = crate::service::forward::depth(&cfg.state_dir).unwrap_or(0);
    let dropped = crate::state::StateDir::new(&cfg.state_dir)
        .status
        .read()
        .and_then(|v| {
            v["counters"][crate::state::status::counter::JOBCOMP_FORWARD_DROPPED].as_u64()
        })
        .unwrap_or(0);
    let answer = crate::service::forward::agent(cfg.ca_file.as_deref(), FORWARD_PROBE_TIMEOUT)
        .and_then(|a| crate::service::forward::probe(target, &a));
    match answer {
        Ok(status) => r.ok(&format!(
            "JobCompForward: {} answers (HTTP {status} to GET {}); {spool} document(s) spooled, {dropped} dropped",
            target.shown(),
            target.base()
        )),
        Err(e) => r.warn(&format!(
            "JobCompForward: {} does not answer ({}): job-completion documents wait in {}/{} ({spool} now, {dropped} dropped); make it answer or remove JobCompForward",
            target.shown(),
            crate::text::one_line(&e, 300),
            cfg.state_dir.display(),
            crate::service::forward::SPOOL_DIR
        )),
    }
}

/// `WorkerRecords` against slurm.conf's health check: do the nodes publish their records
/// (`HealthCheckProgram` running `cvslurm-publish`, with a `HealthCheckInterval`, without
/// which slurmd runs it not even at its start), does this host use them, and how many nodes
/// have one. Silent when neither side is set up.
fn worker_records(ctx: &mut Context, r: &mut Report) {
    let (Some(cfg), Some(sc)) = (&ctx.cfg, &ctx.slurm_conf) else {
        return;
    };
    let program = sc
        .last("HealthCheckProgram")
        .map(|s| s.value.trim().to_string())
        .filter(|v| !v.is_empty());
    let interval = sc
        .last("HealthCheckInterval")
        .and_then(|s| s.value.trim().parse::<u64>().ok())
        .unwrap_or(0);
    let ours = program
        .as_deref()
        .is_some_and(|p| crate::link_names::mode_from_argv0(p) == Some("publish"));
    if !cfg.worker_records {
        if ours && interval > 0 {
            r.warn("slurm.conf runs cvslurm-publish on the nodes (HealthCheckProgram), but WorkerRecords=no: their records are not used; set WorkerRecords=yes");
        }
        return;
    }
    let Some(program) = program else {
        r.warn("WorkerRecords=yes, but slurm.conf sets no HealthCheckProgram: no node publishes its record; set HealthCheckProgram=/opt/slurm/cloudvision/cvslurm-publish and a HealthCheckInterval (README: publish)");
        return;
    };
    if interval == 0 {
        r.warn(&format!(
            "WorkerRecords=yes, but slurm.conf sets no HealthCheckInterval: slurmd runs HealthCheckProgram={program} only with one, not even at its start; set HealthCheckInterval (e.g. 300)"
        ));
        return;
    }
    let how = if ours {
        format!("HealthCheckProgram={program}, every {interval} s")
    } else {
        format!("HealthCheckProgram={program}, a site program: it must run cvslurm-publish")
    };
    let slurm = crate::slurm::runner::Slurm::from_config(cfg);
    let counted =
        crate::slurm::published(&slurm, None, crate::slurm::COMMAND_TIMEOUT).map(|listed| {
            let with = listed
                .values()
                .filter(|p| {
                    p.extra
                        .as_deref()
                        .is_some_and(crate::discovery::published::is_published)
                })
                .count();
            (with, listed.len())
        });
    match counted {
        Ok((0, all)) => r.warn(&format!(
            "WorkerRecords=yes: none of {all} node(s) published a record ({how}); is cvslurm-publish installed on the workers? Their syslog says why"
        )),
        Ok((with, all)) => r.ok(&format!(
            "WorkerRecords=yes: {with} of {all} node(s) published a record ({how})"
        )),
        Err(e) => r.warn(&format!(
            "WorkerRecords=yes ({how}): cannot count the nodes that published a record: {e}"
        )),
    }
}

fn hooks(ctx: &mut Context, r: &mut Report) {
    let Some(sc) = &ctx.slurm_conf else { return };
    check_hook(r, sc, "PrologSlurmctld");
    if !hook_programs(sc.all("EpilogSlurmctld")).is_empty() {
        check_hook(r, sc, "EpilogSlurmctld");
        return;
    }
    // No EpilogSlurmctld: ends from Slurm's job-completion plugin (install.sh --jobcomp) ...
    let port = ctx.cfg.as_ref().map_or(0, |c| c.jobcomp_port);
    let jobcomp_type = sc.last("JobCompType").map(|s| s.value.trim().to_string());
    let jobcomp_loc = sc.last("JobCompLoc").map(|s| s.value.trim().to_string());
    if port != 0 {
        let want = crate::service::jobcomp::location(port);
        if jobcomp_type.as_deref() == Some("jobcomp/elasticsearch")
            && jobcomp_loc
                .as_deref()
                .is_some_and(|l| l.trim_end_matches('/') == want)
        {
            r.ok(&format!(
                "no EpilogSlurmctld: job ends from Slurm's job-completion plugin (JobCompType=jobcomp/elasticsearch, JobCompLoc={want}), taken by the service's receiver"
            ));
        } else {
            r.fail(&format!(
                "JobCompPort={port} in cloudvision.conf, but slurm.conf says JobCompType={} JobCompLoc={}: no job's end would reach the receiver; set JobCompType=jobcomp/elasticsearch and JobCompLoc={want} (install.sh --jobcomp), or remove JobCompPort",
                jobcomp_type.as_deref().unwrap_or("(none)"),
                jobcomp_loc.as_deref().unwrap_or("(none)")
            ));
        }
        return;
    }
    // ... or the PrologSlurmctld-only set-up (install.sh --no-epilog), where the service's
    // reconciliation sends the ends.
    let Some(every) = ctx.cfg.as_ref().map(|c| c.reconcile_interval) else {
        return;
    };
    if every.is_zero() {
        r.fail("slurm.conf: no EpilogSlurmctld, and ReconcileInterval=0: no job's end would be sent; set ReconcileInterval=5 in cloudvision.conf (the PrologSlurmctld-only set-up: install.sh --no-epilog) or add EpilogSlurmctld=/opt/slurm/cloudvision/cvslurm-hook");
        return;
    }
    r.ok(&format!(
        "no EpilogSlurmctld: the PrologSlurmctld-only set-up; the service sends each job's end from slurmctld every {} s (ReconcileInterval)",
        every.as_secs_f64()
    ));
    if every > std::time::Duration::from_secs(60) {
        r.warn(&format!(
            "ReconcileInterval={} s without EpilogSlurmctld: a job's end reaches CloudVision up to that long after it (install.sh --no-epilog sets 5)",
            every.as_secs_f64()
        ));
    }
}

/// The Slurm release (`scontrol --version`), and the commands cvslurm reads it with.
/// With two or more `SlurmctldHost`s: names them, which one is in control (Slurm's
/// heartbeat, [`crate::slurm::leader`]) and whether this host is one of them; the hooks
/// must be on each ([`check_hook`] fails on this host when they are not).
fn controllers(ctx: &mut Context, r: &mut Report) {
    use crate::slurm::leader::{self, Leader};
    let Some(sc) = &ctx.slurm_conf else { return };
    let list = leader::controllers(sc);
    if list.len() < 2 {
        return;
    }
    let me = leader::this_hostname();
    let here = list.iter().find(|c| leader::is_this_host(c, &me));
    let now = u64::try_from(crate::timefmt::now_epoch()).unwrap_or(0);
    let names = |in_control: Option<&str>| {
        list.iter()
            .map(|c| match in_control {
                Some(n) if n == c.name => format!("{} (in control)", c.name),
                _ => c.name.clone(),
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let this = match here {
        Some(c) => format!("this host is {}", c.name),
        None => format!("this host ({me}) is none of them"),
    };
    match leader::leader(sc, now) {
        Leader::InControl { name, age_s, .. } => r.ok(&format!(
            "slurm.conf names {} controllers: {} (heartbeat {age_s} s old); {this}; the hooks and cvslurm must be installed on each",
            list.len(),
            names(Some(&name))
        )),
        Leader::Unknown(why) => r.warn(&format!(
            "slurm.conf names {} controllers: {}; which one is in control cannot be told: {}; {this}; the service here does not lead until it can",
            list.len(),
            names(None),
            crate::text::one_line(&why, 300)
        )),
    }
    if here.is_none() {
        r.warn(&format!(
            "this host ({me}) is not a SlurmctldHost in slurm.conf: the hooks run on the controllers; run cvslurm check on each of them"
        ));
    }
}

/// This host's slurmctld in relation to the hooks ([`hooks_loaded_verdict`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Here<'a> {
    /// This host's slurmctld is in control (or the only controller).
    InControl,
    /// Another controller (its name) is in control: this host's slurmctld is the standby.
    Standby(&'a str),
    /// Who is in control cannot be told.
    Unknown,
}

/// What [`hooks_loaded_verdict`] decides from.
#[derive(Debug, Clone, Copy)]
struct HookFacts<'a> {
    /// The newest file that names a PrologSlurmctld/EpilogSlurmctld, and its mtime (Unix s).
    named_in: &'a Path,
    named_at: f64,
    /// This host's slurmctld: its pid and start (Unix s, from /proc: at most ~1 s early).
    pid: u32,
    started: f64,
    here: Here<'a>,
    /// Slurm 23.11 or later: `scontrol reconfigure` restarts the slurmctld in control in place.
    restarts_in_place: bool,
    /// BOOT_TIME of `scontrol show config` (the slurmctld in control), asked only where it is
    /// this host's and restarts in place: when it last (re)started, Unix s.
    boot_time: Option<i64>,
}

/// How far /proc's start time may lie before the truth (`btime` is whole seconds), and a
/// little more: a slurmctld that started within this of slurm.conf's change is taken to have
/// started after it.
const START_SLACK_S: f64 = 1.5;

/// Whether this host's running slurmctld runs the hooks slurm.conf names: `Ok` (the line) when
/// it started, or was restarted in place by a reconfigure (Slurm 23.11+, the controller in
/// control), after the file naming them last changed; `Err` (the line, with the command that
/// makes it run them) when not. slurmctld reads PrologSlurmctld/EpilogSlurmctld when it starts:
/// one started before slurm.conf named them never runs them, not even after a takeover (a
/// reconfigure restarts only the controller in control; before 23.11 not even that one).
fn hooks_loaded_verdict(f: &HookFacts) -> Result<String, String> {
    let at = |t: f64| {
        crate::timefmt::format_epoch(t.floor() as i64).unwrap_or_else(|| format!("{t:.0}"))
    };
    let named = format!(
        "slurm.conf named the hooks ({} changed at {})",
        f.named_in.display(),
        at(f.named_at)
    );
    let who = match f.here {
        Here::InControl => format!("this host's slurmctld (pid {}, in control)", f.pid),
        Here::Standby(c) => format!(
            "this host's slurmctld (pid {}, the standby: {c} is in control)",
            f.pid
        ),
        Here::Unknown => format!("this host's slurmctld (pid {})", f.pid),
    };
    if f.started + START_SLACK_S >= f.named_at {
        return Ok(format!(
            "{who} started at {}, after {named}: it runs them",
            at(f.started)
        ));
    }
    if f.here == Here::InControl && f.restarts_in_place {
        // BOOT_TIME is whole seconds; a reconfigure in the same second as the change counts.
        if let Some(b) = f.boot_time.filter(|&b| b as f64 >= f.named_at.floor()) {
            return Ok(format!(
                "{who} was restarted in place by scontrol reconfigure at {}, after {named}: it runs them",
                at(b as f64)
            ));
        }
    }
    let remedy = match f.here {
        Here::Standby(c) => format!(
            "restart it here: systemctl restart slurmctld (restarting the standby does not disturb {c})"
        ),
        Here::InControl if f.restarts_in_place => {
            "run scontrol reconfigure (from Slurm 23.11 it restarts the slurmctld in control in place; running jobs keep running)".to_string()
        }
        Here::InControl => {
            "before Slurm 23.11 a reconfigure does not load them: restart it: systemctl restart slurmctld (running jobs keep running)".to_string()
        }
        Here::Unknown => "restart it: systemctl restart slurmctld".to_string(),
    };
    Err(format!(
        "{who} started at {}, before {named}: it does not run them, not even after a takeover; {remedy}",
        at(f.started)
    ))
}

/// Fails when this host's running slurmctld started before slurm.conf named the hooks
/// ([`hooks_loaded_verdict`]); says nothing when no slurmctld runs here (it reads slurm.conf
/// when it starts) or slurm.conf names no hook.
fn hooks_loaded(ctx: &mut Context, r: &mut Report) {
    use crate::slurm::leader::{self, Leader};
    let Some(sc) = &ctx.slurm_conf else { return };
    let mut newest: Option<(PathBuf, f64)> = None;
    for key in crate::mode::check::slurm_facts::HOOK_KEYS {
        for s in sc.all(key) {
            if hook_programs(std::slice::from_ref(s)).is_empty() {
                continue;
            }
            let Some(t) = fs::metadata(&s.file).ok().and_then(|m| m.modified().ok()) else {
                continue;
            };
            let t = t
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            if newest.as_ref().is_none_or(|(_, n)| t > *n) {
                newest = Some((s.file.clone(), t));
            }
        }
    }
    let Some((named_in, named_at)) = newest else {
        return;
    };
    // Only a slurmctld that reads this slurm.conf (its -f, its SLURM_CONF, else the default;
    // one whose command line cannot be read is taken to).
    let same = |p: &Path| {
        let canon = |p: &Path| fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        canon(p) == canon(&ctx.slurm_conf_path)
    };
    let default = Path::new(crate::slurm::conf::DEFAULT_SLURM_CONF);
    let ctld = match crate::slurm::ctld_process::find_here() {
        Ok(v) => v
            .into_iter()
            .filter(|c| {
                crate::slurm::ctld_process::conf_of(c.pid, default).is_none_or(|p| same(&p))
            })
            .min_by(|a, b| a.started.total_cmp(&b.started)),
        Err(e) => {
            r.warn(&format!(
                "cannot tell whether this host's slurmctld runs the hooks: {e}"
            ));
            return;
        }
    };
    let Some(ctld) = ctld else { return };
    let list = leader::controllers(sc);
    let me = leader::this_hostname();
    let in_control;
    let here = if list.len() < 2 {
        Here::InControl
    } else {
        match leader::leader(sc, u64::try_from(crate::timefmt::now_epoch()).unwrap_or(0)) {
            Leader::InControl { index, name, .. } => {
                if list
                    .get(index)
                    .is_some_and(|c| leader::is_this_host(c, &me))
                {
                    Here::InControl
                } else {
                    in_control = name;
                    Here::Standby(&in_control)
                }
            }
            Leader::Unknown(_) => Here::Unknown,
        }
    };
    let slurm = ctx
        .cfg
        .as_ref()
        .map(crate::slurm::runner::Slurm::from_config);
    let restarts_in_place = slurm
        .as_ref()
        .and_then(|s| crate::slurm::version(s).ok())
        .is_some_and(|v| (v.major, v.minor) >= (23, 11));
    let mut facts = HookFacts {
        named_in: &named_in,
        named_at,
        pid: ctld.pid,
        started: ctld.started,
        here,
        restarts_in_place,
        boot_time: None,
    };
    if hooks_loaded_verdict(&facts).is_err() && here == Here::InControl && restarts_in_place {
        facts.boot_time = slurm.as_ref().and_then(|s| {
            let out = s
                .run(
                    "scontrol",
                    &["show", "config"],
                    crate::slurm::COMMAND_TIMEOUT,
                )
                .ok()?;
            out.lines().find_map(|l| {
                let (k, v) = l.split_once('=')?;
                (k.trim() == "BOOT_TIME")
                    .then(|| crate::timefmt::parse_slurm_epoch(v))
                    .flatten()
            })
        });
    }
    match hooks_loaded_verdict(&facts) {
        Ok(line) => r.ok(&line),
        Err(line) => r.fail(&line),
    }
}

fn slurm_release(ctx: &mut Context, r: &mut Report) {
    let Some(cfg) = &ctx.cfg else { return };
    let slurm = crate::slurm::runner::Slurm::from_config(cfg);
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
    let probe = client_for(cfg, Some(t), cfg.request_timeout).and_then(|c| c.probe(None));
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
        if cfg.state_dir.is_dir() {
            check_state_dir_private(r, &cfg.state_dir, u);
        }
        if let Some(file) = &cfg.metrics_file {
            check_metrics_dir(r, file, u);
        }
    }
}

/// The service (SlurmUser) replaces `MetricsFile` by a rename in its directory: it must be
/// able to write there (the config already refused a directory that does not exist).
fn check_metrics_dir(r: &mut Report, file: &Path, u: &SlurmUser) {
    let dir = file.parent().unwrap_or(Path::new("/"));
    match fs::metadata(dir) {
        Ok(m) if m.is_dir() && writable_by(&m, u.uid, u.gid) => r.ok(&format!(
            "MetricsFile directory {} is writable by SlurmUser {}",
            dir.display(),
            u.name
        )),
        _ => r.fail(&format!(
            "MetricsFile directory {} is not writable by SlurmUser {}: run: chgrp {} {} && \
             chmod g+w {} (node_exporter only reads it)",
            dir.display(),
            u.name,
            u.gid,
            dir.display(),
            dir.display()
        )),
    }
}

/// StateDir must be SlurmUser's alone: owned by it, writable by nobody else, under directories
/// nobody else controls (what a root-started cvslurm requires: `crate::privilege`).
fn check_state_dir_private(r: &mut Report, dir: &Path, u: &SlurmUser) {
    match crate::privilege::verify_state_dir(dir) {
        Ok(v) if v.uid == u.uid => r.ok(&format!(
            "StateDir {} is SlurmUser {}'s alone",
            v.path.display(),
            u.name
        )),
        Ok(v) => r.fail(&format!(
            "StateDir {} belongs to uid {}, not SlurmUser {}: run: chown {} {} && chmod 0700 {}",
            v.path.display(),
            v.uid,
            u.name,
            u.name,
            v.path.display(),
            v.path.display()
        )),
        Err(e) => r.fail(&e),
    }
}

fn log_file(ctx: &mut Context, r: &mut Report) {
    if let (Some(cfg), Some(u)) = (&ctx.cfg, &ctx.user) {
        check_log_file(r, &cfg.log_file, u);
    }
}

/// Says whether the hooks hand their events to the service (the fast path) or send them
/// themselves inside slurmctld's prolog/epilog window.
fn delivery_path(ctx: &mut Context, r: &mut Report) {
    let Some(cfg) = &ctx.cfg else { return };
    let state_dir = cfg.state_dir.as_path();
    let sock = crate::state::wake::socket_path(state_dir);
    if crate::state::wake::connect(state_dir).is_some() {
        r.ok(&format!(
            "the cvslurm service listens on {}: hooks only queue their events (no network, no scontrol); the service sends them",
            sock.display()
        ));
    } else {
        r.warn(&format!(
            "no cvslurm service listens on {}: each hook asks slurmctld and sends to CloudVision itself, inside slurmctld's prolog/epilog window (slower scheduling on busy clusters): run systemctl enable --now cvslurm",
            sock.display()
        ));
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
        E::NotCloudVision { .. } => {
            "set ApiServer to CloudVision's own address (not a web server, proxy or stub in front of it)"
        }
        E::Invalid(_) => "this is a bug in cvslurm, please report it",
    }
}

/// Why `program` cannot run on this host (it is missing or not an executable file), if so.
fn missing_here(program: &str) -> Option<String> {
    let path = Path::new(program);
    if !path.is_absolute() {
        return None;
    }
    match fs::metadata(path) {
        Err(e) => Some(format!("{program}: {e}")),
        Ok(m) if !m.is_file() || m.mode() & 0o111 == 0 => {
            Some(format!("{program} is not an executable file"))
        }
        Ok(_) => None,
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
    // A hook slurm.conf names but this host lacks: slurmctld 23.02+ does not start here, so
    // a backup controller set up this way can never take over.
    let missing: Vec<String> = programs.iter().filter_map(|p| missing_here(p)).collect();
    if !missing.is_empty() {
        r.fail(&format!(
            "{key}: {} on this host: slurmctld cannot run it here, and from Slurm 23.02 on a slurmctld whose disk lacks the hook does not even start (a backup controller could never take over); install cvslurm on every SlurmctldHost before slurm.conf names it (install.sh)",
            missing.join("; ")
        ));
        return;
    }
    let mut why = Vec::new();
    for p in &programs {
        match resolve_hook(p) {
            HookTarget::Cvslurm(bin, this) => {
                r.ok(&format!(
                    "{key}={p} runs cvslurm ({}{})",
                    bin.display(),
                    if this {
                        ", this very binary"
                    } else {
                        ": another cvslurm build than the one running this check"
                    }
                ));
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
    use crate::slurm::conf::Setting;

    /// The decision of `hooks_loaded`: started after the change, or (in control, 23.11+)
    /// reconfigured after it: runs them; else the command that makes it, by role and release.
    #[test]
    fn a_slurmctld_started_before_the_hooks_is_named_with_its_restart() {
        let conf = Path::new("/etc/slurm/slurm.conf");
        let base = HookFacts {
            named_in: conf,
            named_at: 1_800_000_100.4,
            pid: 42,
            started: 1_800_000_000.0,
            here: Here::Standby("ctl1"),
            restarts_in_place: true,
            boot_time: None,
        };
        // the standby, on every release: restart it, the controller in control undisturbed
        for restarts_in_place in [true, false] {
            let f = HookFacts {
                restarts_in_place,
                ..base
            };
            let e = hooks_loaded_verdict(&f).unwrap_err();
            assert!(e.contains("pid 42, the standby: ctl1 is in control"), "{e}");
            assert!(e.contains("before slurm.conf named the hooks (/etc/slurm/slurm.conf changed at 2027-01-15T08:01:40Z)"), "{e}");
            assert!(e.contains("not even after a takeover"), "{e}");
            assert!(e.ends_with("restart it here: systemctl restart slurmctld (restarting the standby does not disturb ctl1)"), "{e}");
            // a BOOT_TIME is never the standby's own (scontrol asks the one in control)
            let f = HookFacts {
                boot_time: Some(1_800_000_200),
                ..f
            };
            assert!(hooks_loaded_verdict(&f).is_err());
        }
        // started after the change (or within the slack of /proc's whole-second boot time)
        for started in [1_800_000_101.0, 1_800_000_099.0] {
            let ok = hooks_loaded_verdict(&HookFacts { started, ..base }).unwrap();
            assert!(
                ok.contains("after slurm.conf named the hooks") && ok.ends_with("it runs them"),
                "{ok}"
            );
        }
        assert!(hooks_loaded_verdict(&HookFacts {
            started: 1_800_000_098.8,
            ..base
        })
        .is_err());
        // in control, 23.11+: a reconfigure restarted it in place (BOOT_TIME, whole seconds,
        // the same second as the change counts), else run one
        let ctl = HookFacts {
            here: Here::InControl,
            ..base
        };
        let e = hooks_loaded_verdict(&ctl).unwrap_err();
        assert!(
            e.contains("(pid 42, in control)") && e.contains("run scontrol reconfigure"),
            "{e}"
        );
        for b in [1_800_000_100, 1_800_000_300] {
            let ok = hooks_loaded_verdict(&HookFacts {
                boot_time: Some(b),
                ..ctl
            })
            .unwrap();
            assert!(
                ok.contains("restarted in place by scontrol reconfigure"),
                "{ok}"
            );
        }
        assert!(hooks_loaded_verdict(&HookFacts {
            boot_time: Some(1_800_000_099),
            ..ctl
        })
        .is_err());
        // in control before 23.11: a reconfigure does not load them; restart
        let old = HookFacts {
            restarts_in_place: false,
            boot_time: Some(1_800_000_300),
            ..ctl
        };
        let e = hooks_loaded_verdict(&old).unwrap_err();
        assert!(
            e.contains("before Slurm 23.11") && e.contains("systemctl restart slurmctld"),
            "{e}"
        );
        // who is in control unknown
        let e = hooks_loaded_verdict(&HookFacts {
            here: Here::Unknown,
            ..base
        })
        .unwrap_err();
        assert!(
            e.ends_with("restart it: systemctl restart slurmctld"),
            "{e}"
        );
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
    }

    #[test]
    fn resolves_hook_symlinks_and_site_scripts() {
        use std::os::unix::fs::{symlink, PermissionsExt};
        let dir = std::env::temp_dir().join(format!("cvslurm-check-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        // The running binary stands for cvslurm: a link to it, and a copy of it.
        let me = std::env::current_exe().unwrap();
        let bin = dir.join("cvslurm");
        symlink(&me, &bin).unwrap();
        symlink("cvslurm", dir.join("cvslurm-hook")).unwrap();
        symlink(dir.join("cvslurm-hook"), dir.join("site-prolog")).unwrap();
        let copy = dir.join("copy");
        fs::create_dir(&copy).unwrap();
        fs::copy(&me, copy.join("cvslurm-hook")).unwrap();
        // An executable merely named like the hook.
        let fake = dir.join("fake");
        fs::create_dir(&fake).unwrap();
        fs::write(fake.join("cvslurm-hook"), b"\x7fELF\0").unwrap();
        fs::set_permissions(fake.join("cvslurm-hook"), fs::Permissions::from_mode(0o755)).unwrap();
        // The Python reference under its own name.
        let py = dir.join("cv-job-hook.py");
        fs::write(
            &py,
            "#!/usr/bin/env python3\n\"\"\"cv-job-hook: send the job\"\"\"\nimport os\n",
        )
        .unwrap();
        fs::set_permissions(&py, fs::Permissions::from_mode(0o755)).unwrap();
        let script = dir.join("prolog.sh");
        fs::write(
            &script,
            format!(
                "#!/bin/sh\n/usr/local/bin/x\n{}\n",
                dir.join("cvslurm-hook").display()
            ),
        )
        .unwrap();
        fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
        let names_only = dir.join("names-only.sh");
        fs::write(&names_only, "#!/bin/sh\n/opt/nowhere/cvslurm-hook\n").unwrap();
        fs::set_permissions(&names_only, fs::Permissions::from_mode(0o755)).unwrap();
        let other = dir.join("other.sh");
        fs::write(&other, "#!/bin/sh\n# cvslurm-hook is not called\nexit 0\n").unwrap();
        fs::set_permissions(&other, fs::Permissions::from_mode(0o755)).unwrap();
        let s = |p: &Path| p.to_str().unwrap().to_string();
        let real = fs::canonicalize(&me).unwrap();
        assert_eq!(
            resolve_hook(&s(&dir.join("cvslurm-hook"))),
            HookTarget::Cvslurm(real.clone(), true)
        );
        assert_eq!(
            resolve_hook(&s(&copy.join("cvslurm-hook"))),
            HookTarget::Cvslurm(fs::canonicalize(copy.join("cvslurm-hook")).unwrap(), true)
        );
        let why = |p: &Path| match resolve_hook(&s(p)) {
            HookTarget::Other(w) => w,
            t => panic!("{} resolved to {t:?}", p.display()),
        };
        assert!(why(&dir.join("site-prolog")).contains("selects no mode"));
        assert!(why(&fake.join("cvslurm-hook")).contains("is an executable that is not cvslurm"));
        assert!(why(&py).contains("is a Python script that does not call cvslurm-hook"));
        assert_eq!(
            resolve_hook(&s(&script)),
            HookTarget::SiteScript(fs::canonicalize(&script).unwrap())
        );
        assert!(why(&names_only).contains("does not call cvslurm-hook"));
        assert!(why(&other).contains("does not call cvslurm-hook"));
        assert!(matches!(resolve_hook("cvslurm-hook"), HookTarget::Other(_)));
        assert!(matches!(
            resolve_hook(&s(&dir.join("gone"))),
            HookTarget::Other(_)
        ));
        fs::remove_dir_all(&dir).unwrap();
    }
}
