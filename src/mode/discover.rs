//! `cvslurm discover`: run on a worker (through srun), print its network interfaces as one
//! record (one JSON line, or `cvslurm-part` lines when longer:
//! [`crate::discovery::record::frame`]; the record is
//! [`crate::discovery::record::DiscoverRecord`], built by [`crate::discovery::discover`]).

use super::startup::usage;
use crate::config::{parse_bool, Config};
use crate::discovery::record::frame;
use crate::discovery::topology::Roots;
use crate::discovery::{discover, own_sha256, Filter};
use crate::logging::{self, Sink};
use argh::FromArgs;
use regex_lite::Regex;
use std::fs;
use std::path::{Path, PathBuf};

/// The long flags of `cvslurm discover` (`--help` aside), for `cvslurm --list-flags discover`, the
/// completion and the documentation tests; a unit test in [`crate::cli`] holds it to [`Args`].
pub const FLAGS: &[&str] = &[
    "--node-name",
    "--interface-regex",
    "--physical-only",
    "--require-ip",
    "--sys-class-net",
    "--sys-root",
    "--topology",
    "--expect-sha256",
];

/// Print this node's network interfaces as one JSON record (run on workers through srun).
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "discover", help_triggers("-h", "--help", "help"))]
pub struct Args {
    /// node name (default $SLURMD_NODENAME)
    #[argh(option)]
    node_name: Option<String>,
    /// interface names to report (default ^(eth|eno|ens|enp|em))
    #[argh(option)]
    interface_regex: Option<String>,
    /// only NICs with a device link in sysfs: yes or no (default yes)
    #[argh(option)]
    physical_only: Option<String>,
    /// skip NICs without an IPv4 address: yes or no (default yes)
    #[argh(option)]
    require_ip: Option<String>,
    /// where to read interfaces (default <sys-root>/sys/class/net)
    #[argh(option)]
    sys_class_net: Option<PathBuf>,
    /// read <DIR>/sys and <DIR>/proc instead of /sys and /proc (default /)
    #[argh(option, default = "PathBuf::from(\"/\")")]
    sys_root: PathBuf,
    /// also report the GPUs and which GPUs each interface is nearest to (JobInterfaces)
    #[argh(switch)]
    topology: bool,
    /// refuse to run unless this executable's SHA-256 (hex) is this one and its directory is
    /// writable only by root and this user (inventory passes it with DiscoveryBcast)
    #[argh(option)]
    expect_sha256: Option<String>,
}

/// Checks a broadcast copy of the binary; an error means: do not run. The copy must lie in a
/// directory only root and this user can change ([`private_dir`]) and be byte for byte what
/// inventory sent.
fn check_copy(expect: Option<&str>) -> Result<(), String> {
    if let Some(want) = expect {
        let exe = fs::read_link("/proc/self/exe")
            .map_err(|e| format!("cannot find my own executable: {e}"))?;
        let exe = exe.to_string_lossy();
        let exe = Path::new(exe.strip_suffix(" (deleted)").unwrap_or(&exe));
        if let Some(dir) = exe.parent() {
            private_dir(dir, nix::unistd::geteuid().as_raw())?;
        }
        let got = own_sha256().map_err(|e| format!("cannot read my own executable: {e}"))?;
        if !got.eq_ignore_ascii_case(want.trim()) {
            return Err(format!(
                "this executable (SHA-256 {got}) is not the one inventory sent ({want}); not running"
            ));
        }
    }
    Ok(())
}

/// Checks that only root and `uid` can put or replace files in `dir`: it and every directory
/// above it belong to root or `uid`; `dir` is writable by no one else, and a directory above
/// it only when sticky (others cannot rename what they do not own there).
pub fn private_dir(dir: &Path, uid: u32) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let fix = "set DiscoveryBcastDir to a directory only root and the user running the \
               inventory can write";
    let mut at = Some(dir);
    let mut first = true;
    while let Some(d) = at {
        let m = fs::metadata(d).map_err(|e| format!("cannot check {}: {e}", d.display()))?;
        let others_write = m.mode() & 0o022 != 0;
        let sticky = m.mode() & 0o1000 != 0;
        if m.uid() != 0 && m.uid() != uid {
            return Err(format!(
                "this copy's directory {} is under {}, owned by uid {}: not running; {fix}",
                dir.display(),
                d.display(),
                m.uid()
            ));
        }
        if others_write && (first || !sticky) {
            return Err(format!(
                "this copy's directory {} is open to other users ({} has mode {:o}): not \
                 running; {fix}",
                dir.display(),
                d.display(),
                m.mode() & 0o7777
            ));
        }
        first = false;
        at = d.parent();
    }
    Ok(())
}

/// Runs `cvslurm discover`: prints the record on stdout; 1 when it cannot, 2 on a usage error.
pub fn run(a: Args) -> i32 {
    logging::init(Sink::Stderr, Path::new("/dev/null"), log::LevelFilter::Info);
    if let Err(e) = check_copy(a.expect_sha256.as_deref()) {
        log::error!("{e}");
        return 1;
    }
    let d = Config::default();
    let regex = match a.interface_regex.as_deref().map(Regex::new) {
        None => d.interface_regex,
        Some(Ok(r)) => r,
        Some(Err(e)) => return usage(&format!("--interface-regex: {e}")),
    };
    let flag = |v: Option<&str>, default: bool, name: &str| -> Result<bool, String> {
        v.map_or(Ok(default), |s| {
            parse_bool(s).map_err(|e| format!("{name}: {e}"))
        })
    };
    let filter = match (
        flag(
            a.physical_only.as_deref(),
            d.interface_physical_only,
            "--physical-only",
        ),
        flag(
            a.require_ip.as_deref(),
            d.interface_require_ip,
            "--require-ip",
        ),
    ) {
        (Ok(p), Ok(r)) => Filter {
            name_regex: regex,
            physical_only: p,
            require_ip: r,
        },
        (Err(e), _) | (_, Err(e)) => return usage(&e),
    };
    let roots = Roots::under(&a.sys_root);
    let sys_class_net = a
        .sys_class_net
        .unwrap_or_else(|| roots.sys.join("class/net"));
    match discover(
        a.node_name.as_deref(),
        &sys_class_net,
        &filter,
        a.topology.then_some(&roots),
    ) {
        Ok(rec) => {
            use std::io::Write;
            // One write, starting on a fresh line: srun passes each task's output through as
            // it comes, so another node's unterminated output (a worker printing garbage
            // without a newline) would otherwise swallow this record.
            // A record too long to reach srun in one piece goes as parts (see [`frame`]).
            let json = serde_json::to_string(&rec).expect("serializes");
            let line = frame(&rec.node_name, &json);
            let mut out = std::io::stdout().lock();
            if out
                .write_all(line.as_bytes())
                .and_then(|_| out.flush())
                .is_err()
            {
                return 1;
            }
            0
        }
        Err(e) => {
            log::error!("{e}");
            1
        }
    }
}
