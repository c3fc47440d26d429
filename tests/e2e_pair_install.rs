//! A Slurm HA pair installed as README "Two controllers" says, with install.sh itself: both
//! slurmctlds run before slurm.conf names the hooks; `install.sh --no-hooks` on ctl2 (the
//! backup), then `install.sh` on ctl1 (the primary, in control), no slurmctld restarted. ctl2's
//! slurmctld started before slurm.conf named the hooks: it does not run them, not even after a
//! takeover (a reconfigure restarts only the controller in control). install.sh names it for
//! a restart, `cvslurm check` on ctl2 fails naming the restart, and passes once ctl2's
//! slurmctld restarted; after a takeover, ctl2 runs the hook.
//!
//! `tests/cluster/cluster.sh up --controllers 2 1` (ctl1 and ctl2 each a "host" of its own:
//! network, UTS and mount namespaces with its own /opt, /var/spool, /var/log; /etc/slurm and
//! StateSaveLocation shared); install.sh's defaults (/opt/slurm/cloudvision, /var/spool/cvslurm,
//! /var/log/slurm) land on each host's own disk. `--no-service` (no systemd there), CloudVision
//! unreachable (`--offline`): the hook queues what it cannot send and logs it.
//!
//! Needs root; run by `tests/run-all.sh` once per Slurm version; by hand:
//! `SLURM=24.11 PATH=/var/tmp/cvslurm-cluster/bin:$PATH cargo test --release --test
//! e2e_pair_install -- --ignored`.

#[path = "common/cluster.rs"]
mod cluster;
mod common;
use cluster::*;
use common::*;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const WORK: &str = "/var/tmp/cvslurm-e2e-pair-install";
const INSTALL_DIR: &str = "/opt/slurm/cloudvision";

/// `cluster.sh exec CTL CMD...`: CMD as on that controller; its output, whatever its status.
fn on(ctl: &str, cmd: &[&str]) -> (bool, String) {
    let out = Command::new(repo().join("tests/cluster/cluster.sh"))
        .arg("exec")
        .arg(ctl)
        .args(cmd)
        .output()
        .unwrap();
    (
        out.status.success(),
        format!("{}{}", stdout(&out), stderr(&out)),
    )
}

/// install.sh on controller `ctl` with `extra` options; its output.
fn install(ctl: &str, extra: &[&str]) -> String {
    let remote = format!("CVSLURM_REMOTE={WORK}/remote");
    let units = format!("SYSTEMD_UNIT_DIR={WORK}/{ctl}-units");
    let rotate = format!("LOGROTATE_DIR={WORK}/{ctl}-logrotate");
    let bin = format!("{WORK}/cvslurm");
    let token = format!("{WORK}/token");
    let script = repo().join("install.sh");
    let mut cmd = vec![
        "env",
        &remote,
        &units,
        &rotate,
        "SLURM_CONF=/etc/slurm/slurm.conf",
        script.to_str().unwrap(),
        "--api-server",
        "10.99.0.1:9",
        "--api-token-file",
        &token,
        "--offline",
        "--no-service",
        "--epilog",
        "--binary",
        &bin,
    ];
    cmd.extend(extra);
    let (ok, out) = on(ctl, &cmd);
    assert!(ok, "install.sh {extra:?} on {ctl} failed:\n{out}");
    out
}

/// `cvslurm check` on `ctl`: the line about this host's slurmctld and the hooks.
fn check_line(ctl: &str) -> String {
    let (_, out) = on(
        ctl,
        &[
            "env",
            "CVSLURM_CONF=/etc/slurm/cloudvision.conf",
            &format!("{INSTALL_DIR}/cvslurm"),
            "check",
        ],
    );
    out.lines()
        .find(|l| l.contains("this host's slurmctld"))
        .unwrap_or_else(|| panic!("check on {ctl} says nothing of its slurmctld:\n{out}"))
        .to_string()
}

#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn readme_install_order_names_the_standby_to_restart() {
    keep_inherited_fds_to_ourselves();
    let work = Path::new(WORK);
    fresh_work_dir(work, "TERM");
    let src = std::env::var_os("CVSLURM_E2E_BIN").map_or_else(bin, std::path::PathBuf::from);
    fs::copy(src, work.join("cvslurm")).unwrap();
    fs::set_permissions(work.join("cvslurm"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(work.join("token"), format!("{TOKEN}\n")).unwrap();
    fs::set_permissions(work.join("token"), fs::Permissions::from_mode(0o600)).unwrap();
    // How install.sh asks whether another controller has the hook (`test -x PATH`): that
    // controller's own /opt, seen from either one.
    fs::write(
        work.join("remote"),
        format!(
            "#!/bin/sh\nhost=\"$1\"; shift\n[ \"$1\" = test ] && [ \"$2\" = -x ] || exit 2\ntest -x \"{CLUSTER_DIR}/hosts/$host/opt${{3#/opt}}\"\n"
        ),
    )
    .unwrap();
    fs::set_permissions(work.join("remote"), fs::Permissions::from_mode(0o755)).unwrap();
    let _down = Down;
    let _cleanup = Cleanup;
    let t = Instant::now();
    cluster_sh(
        &["up", "--controllers", "2", "1"],
        // backfill every 5 s: a job submitted just after a takeover waits for the next
        // scheduling pass (Slurm's default: 30 s)
        &[("CLUSTER_NAME", CLUSTER), ("BF_INTERVAL", "5")],
    );
    eprintln!("[e2e] pair up in {:.1} s", t.elapsed().as_secs_f64());
    let (major, minor) = slurm_version();
    let restarts_in_place = (major, minor) >= (23, 11);

    // README's order: the backup without the hook lines, then the primary with them.
    let out2 = install("ctl2", &["--no-hooks"]);
    assert!(!out2.contains("restart slurmctld on"), "{out2}");
    let out1 = install("ctl1", &[]);
    assert!(
        out1.contains("controller ctl2 has /opt/slurm/cloudvision/cvslurm-hook"),
        "{out1}"
    );
    let say = out1
        .lines()
        .find(|l| l.contains("WARNING: two controllers"))
        .unwrap_or_else(|| panic!("install.sh names no slurmctld to restart:\n{out1}"));
    assert!(say.contains("systemctl restart slurmctld"), "{say}");
    if restarts_in_place {
        assert!(
            say.contains("restart slurmctld on ctl2 (ctl1 is in control;"),
            "{say}"
        );
    } else {
        assert!(
            say.contains("restart slurmctld on every controller, ctl1 ctl2"),
            "{say}"
        );
    }

    // ctl2's slurmctld, never restarted: check fails there, naming the restart.
    let line = check_line("ctl2");
    assert!(line.starts_with("FAIL "), "{line}");
    assert!(
        line.contains("the standby: ctl1 is in control")
            && line.contains("not even after a takeover"),
        "{line}"
    );
    assert!(
        line.ends_with("restart it here: systemctl restart slurmctld (restarting the standby does not disturb ctl1)"),
        "{line}"
    );
    // ctl1's: restarted in place by install.sh's reconfigure from 23.11; before, a restart.
    let line1 = check_line("ctl1");
    if restarts_in_place {
        assert!(
            line1.starts_with("ok ")
                && line1.contains("restarted in place by scontrol reconfigure"),
            "{line1}"
        );
    } else {
        assert!(
            line1.starts_with("FAIL ") && line1.contains("systemctl restart slurmctld"),
            "{line1}"
        );
    }

    // The standby restarted (what README says): check passes; ctl1 stays in control.
    cluster_sh(&["stop-slurmctld", "ctl2"], &[]);
    cluster_sh(&["start-slurmctld", "ctl2"], &[]);
    let line = check_line("ctl2");
    assert!(
        line.starts_with("ok ") && line.contains("after slurm.conf named the hooks"),
        "{line}"
    );
    let ic = cluster_sh(&["in-control"], &[]);
    assert!(stdout(&ic).starts_with("ctl1"), "{}", stdout(&ic));

    // ...and runs the hook once it has control.
    cluster_sh(&["takeover"], &[]);
    let id = sbatch(&["-w", "n1", "--wrap", "true"]);
    let log = Path::new(CLUSTER_DIR).join("hosts/ctl2/log/slurm/cvjob.log");
    wait_until(
        &format!("ctl2's hook to log job {id}"),
        Duration::from_secs(60),
        || fs::read_to_string(&log).is_ok_and(|l| l.contains(&format!("job {id}@"))),
    );
}

/// Removes what install.sh wrote into the shared /etc/slurm (the cluster's `down` removes
/// only its own files), the test passed or not.
struct Cleanup;

impl Drop for Cleanup {
    fn drop(&mut self) {
        for f in ["cloudvision.conf", "cloudvision.token"] {
            let _ = fs::remove_file(Path::new("/etc/slurm").join(f));
        }
    }
}
