//! Hardening (issue 11) through the binary: a config with bad lines, the token kept from Slurm
//! commands, files' modes, and the reference-parity details of the command line.

mod common;
use common::*;
use cvslurm::state::layout;
use std::fs;

#[test]
fn a_bad_config_line_is_skipped_and_reported_the_rest_applies() {
    let cv = Standin::start();
    let site = Site::new(&cv.server(), &cv.ca(), "Bogus=1\nHookTimeout=soon");
    // A UTF-8 byte-order mark, as some editors write it.
    let text = fs::read_to_string(&site.conf).unwrap();
    fs::write(&site.conf, format!("\u{feff}{text}")).unwrap();
    let (out, _) = site.hook(&job_env("prolog_slurmctld", "15", &[]));
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        cv.accepted("JobConfig").len(),
        1,
        "ApiServer and the rest apply"
    );
    let log = site.log();
    let conf = site.conf.display().to_string();
    assert!(
        log.contains(&format!("{conf}:10: Bogus: unknown key")),
        "{log}"
    );
    assert!(
        log.contains(&format!("{conf}:11: HookTimeout: \"soon\"")),
        "{log}"
    );
    assert!(
        site.state_dir.join(layout::JOBS).is_dir(),
        "StateDir from the file is used"
    );

    // `check` fails on each bad line, naming it.
    let out = site.run(&["check"]);
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    assert!(
        text.contains(&format!("FAIL config: {conf}:10: Bogus: unknown key")),
        "{text}"
    );
    assert!(
        text.contains(&format!("FAIL config: {conf}:11: HookTimeout")),
        "{text}"
    );
}

/// Slurm commands (and so srun's workers) never see `CV_API_TOKEN`. The `scontrol` here only
/// records the environment it was given.
#[test]
fn slurm_commands_do_not_get_the_token() {
    use std::os::unix::fs::PermissionsExt;
    let site = Site::new("127.0.0.1:1", std::path::Path::new("/nonexistent"), "");
    let env_file = site.dir.path().join("scontrol.env");
    for name in ["scontrol", "sacct", "squeue", "sinfo", "srun"] {
        let p = site.bin_dir.join(name);
        fs::write(
            &p,
            format!("#!/bin/sh\nenv >> {}\nexit 1\n", env_file.display()),
        )
        .unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
    }
    let out = std::process::Command::new(bin())
        .args(["send", "42"])
        .env("CVSLURM_CONF", &site.conf)
        .env("CV_API_TOKEN", "s3cret-from-env")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let seen = fs::read_to_string(&env_file).unwrap();
    assert!(
        seen.contains("SLURM_TIME_FORMAT=%s"),
        "scontrol ran: {seen}"
    );
    assert!(
        !seen.contains("s3cret"),
        "the token reached a Slurm command"
    );
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

fn owner(p: &std::path::Path) -> u32 {
    use std::os::unix::fs::MetadataExt;
    fs::symlink_metadata(p).unwrap().uid()
}

/// Root (`cvslurm flush` by hand) with StateDir owned by SlurmUser (here `nobody`): the links
/// SlurmUser planted there lead root nowhere.
#[test]
fn root_never_follows_links_in_a_directory_another_user_controls() {
    use std::os::unix::fs::symlink;
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let nobody = 65534;
    let cv = Standin::start();
    // CloudVision unreachable: the flush keeps what it holds.
    let site = Site::new("127.0.0.1:1", &cv.ca(), "");
    let root_dir = site.dir.path();
    let victim = root_dir.join("victim");
    fs::write(&victim, "root's own\n").unwrap();
    let elsewhere = root_dir.join("elsewhere");
    fs::create_dir(&elsewhere).unwrap();
    fs::create_dir(&site.state_dir).unwrap();
    std::os::unix::fs::chown(&site.state_dir, Some(nobody), Some(nobody)).unwrap();
    symlink(&victim, site.state_dir.join(layout::OUTBOX_LOCK)).unwrap();
    symlink(&victim, site.state_dir.join(layout::SERVICE_STATUS)).unwrap();
    symlink(&elsewhere, site.state_dir.join(layout::REJECTED)).unwrap();
    let out = site.run(&["flush", "--no-reconcile"]);
    let said = stderr(&out);
    assert_eq!(
        fs::read_to_string(&victim).unwrap(),
        "root's own\n",
        "{said}"
    );
    assert_eq!(owner(&victim), 0, "victim chowned: {said}");
    assert_eq!(
        owner(&elsewhere),
        0,
        "a directory outside StateDir chowned: {said}"
    );
}

/// Files cvslurm creates get explicit modes, whatever the umask: nothing in StateDir is open
/// to group or others, the log is at most 0640.
#[test]
fn created_files_have_explicit_modes_under_umask_zero() {
    use std::os::unix::fs::PermissionsExt;
    let cv = Standin::start();
    let site = Site::new(&cv.server(), &cv.ca(), "");
    let link = site.link("cvslurm-hook");
    let with_umask_0 = |vars: &[(&str, &str)], args: &[&str]| {
        let mut c = std::process::Command::new("sh");
        c.arg("-c")
            .arg("umask 000; exec \"$@\"")
            .arg("sh")
            .args(args)
            .env_clear()
            .env("CVSLURM_CONF", &site.conf);
        for (k, v) in vars {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    let link = link.to_str().unwrap();
    with_umask_0(&job_env("prolog_slurmctld", "70", &[]), &[link]);
    with_umask_0(
        &job_env("epilog_slurmctld", "70", &[("SLURM_JOB_EXIT_CODE2", "0:0")]),
        &[link],
    );
    let bin = bin();
    with_umask_0(&[], &[bin.to_str().unwrap(), "flush", "--no-reconcile"]);
    assert!(
        site.state_dir
            .join(layout::VERIFY)
            .read_dir()
            .unwrap()
            .count()
            > 0
    );
    assert!(site.state_dir.join(layout::SERVICE_STATUS).exists());
    let mut seen = 0;
    let mut stack = vec![site.state_dir.clone()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap().flatten() {
            let m = e.metadata().unwrap();
            let mode = m.permissions().mode() & 0o777;
            assert_eq!(mode & 0o077, 0, "{} has mode {mode:o}", e.path().display());
            seen += 1;
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    assert!(seen >= 7, "{seen}");
    let mode = fs::metadata(&site.log_file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode & !0o640, 0, "LogFile mode {mode:o}");
}

/// A redirect or a 408 says nothing against the event: it stays queued, nothing is rejected.
#[test]
fn redirects_and_request_timeouts_are_retried_not_rejected() {
    use serde_json::json;
    let cv = Standin::start();
    let site = Site::new(&cv.server(), &cv.ca(), "");
    for (id, status) in [("31", 302), ("32", 307), ("33", 408)] {
        cv.set_mode(json!({"mode": "status", "status": status}));
        let (out, _) = site.hook(&job_env("prolog_slurmctld", id, &[]));
        assert_eq!(out.status.code(), Some(0));
    }
    assert_eq!(site.outbox().len(), 3, "{}", site.log());
    let out = site.run(&["flush", "--no-reconcile"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("0 delivered, 3 kept, 0 rejected"),
        "{}",
        stdout(&out)
    );
    let rejected = site.state_dir.join(layout::REJECTED);
    assert_eq!(fs::read_dir(&rejected).map(|d| d.count()).unwrap_or(0), 0);
    cv.set_mode(json!({"mode": "ok"}));
    let out = site.run(&["flush", "--no-reconcile"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(cv.accepted("JobConfig").len(), 3);
}

fn tenant_args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec![
        "send",
        "--tenant",
        "tenant-unique-id",
        "--name",
        "train",
        "--location",
        "tenant-a",
    ];
    v.extend_from_slice(extra);
    v
}

/// Parity with the reference's `send`: the tenant id is key.id as given, a dry run shows the
/// full URL, a bad CV_API_SERVER is an error, an ended job needs its end time.
#[test]
fn send_parity_with_the_reference() {
    let cv = Standin::start();
    let site = Site::new(&cv.server(), &cv.ca(), "");
    let running = ["--state", "running", "--start", "2025-12-05T10:30:00Z"];
    let mut args = tenant_args(&running);
    args.extend(["--interfaces", "aa:bb:cc:dd:ee:01", "--dry-run"]);
    let out = site.run(&args);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.starts_with(&format!(
            "POST https://{}/api/resources/computejob/v1/JobConfig\n",
            cv.server()
        )),
        "{text}"
    );
    assert!(text.contains("\"id\": \"tenant-unique-id\""), "{text}");
    args.pop();
    let out = site.run(&args);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(cv.accepted("JobConfig")[0]["key"]["id"], "tenant-unique-id");

    // An ended job without its end: an error naming the flag, nothing sent.
    let mut args = tenant_args(&["--state", "completed", "--start", "2025-12-05T10:30:00Z"]);
    args.extend(["--interfaces", "aa:bb:cc:dd:ee:01"]);
    let out = site.run(&args);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--end is needed"), "{}", stderr(&out));

    // An invalid CV_API_SERVER is an error, not silently ignored.
    let out = std::process::Command::new(bin())
        .args(tenant_args(&running))
        .args(["--nodes", "a1"])
        .env("CVSLURM_CONF", &site.conf)
        .env("CV_API_SERVER", "http://cv.example.com")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(
            "CV_API_SERVER=\"http://cv.example.com\": CloudVision is reached over HTTPS only"
        ),
        "{}",
        stderr(&out)
    );
}

/// The library refuses an ended interface-mode job without end_time before sending.
#[test]
fn invalid_job_configs_are_refused_before_sending() {
    use cvslurm::cloudvision::{Client, ClientOptions, SendError};
    use cvslurm::payload::{JobConfig, JobState, Key};
    let cv = Standin::start();
    let client = Client::new(ClientOptions {
        server: cv.server(),
        token: cvslurm::config::Token::new(TOKEN),
        ca_file: Some(cv.ca()),
        pins: Vec::new(),
        insecure: false,
        timeout: std::time::Duration::from_secs(10),
    })
    .unwrap();
    let job = JobConfig {
        key: Key { id: "t-1".into() },
        name: Some("n".into()),
        state: JobState::Completed,
        start_time: Some("2025-12-05T10:30:00Z".into()),
        end_time: None,
        location: Some("l".into()),
        job_type: None,
        nodes: None,
        interfaces: Some(vec!["aa:bb:cc:dd:ee:01".to_string()].into()),
    };
    let e = client.post_job(&job, None).unwrap_err();
    assert!(matches!(e, SendError::Invalid(_)), "{e}");
    assert!(e.to_string().contains("completed without end_time"), "{e}");
    assert!(cv.requests().is_empty(), "nothing reached CloudVision");
}

/// The command line: `cvslurm-hook --help`, argh's errors with the prefix, help into a closed
/// pipe, the monitor saying where it logs, and the reference's look-ahead filter.
#[test]
fn command_line_details() {
    let site = Site::new("127.0.0.1:1", std::path::Path::new("/nonexistent"), "");
    let hook = site.link("cvslurm-hook");
    let out = std::process::Command::new(&hook)
        .arg("--help")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(
        stdout(&out).starts_with("Usage: cvslurm hook"),
        "{}",
        stdout(&out)
    );
    // Any other argument still runs the hook, which exits 0.
    let out = std::process::Command::new(&hook)
        .arg("--bogus")
        .env_clear()
        .env("CVSLURM_CONF", &site.conf)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(out.stdout.is_empty());

    let out = std::process::Command::new(bin())
        .args(["send", "--frob"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).starts_with("cvslurm: Unrecognized argument: --frob"),
        "{}",
        stderr(&out)
    );

    // Help written into a pipe nobody reads: no panic.
    let (r, w) = nix::unistd::pipe().unwrap();
    drop(r);
    let out = std::process::Command::new(bin())
        .arg("help")
        .stdout(std::process::Stdio::from(w))
        .output()
        .unwrap();
    assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
    use std::os::unix::process::ExitStatusExt;
    assert!(
        out.status.signal() == Some(13) || out.status.code() == Some(0),
        "{:?}",
        out.status
    );

    let out = std::process::Command::new(bin())
        .args(["inventory", "--monitor"])
        .env("CVSLURM_CONF", &site.conf)
        .env_remove("JOURNAL_STREAM")
        .output()
        .unwrap();
    assert!(
        stderr(&out).contains(&format!(
            "inventory --monitor logs to {}",
            site.log_file.display()
        )),
        "{}",
        stderr(&out)
    );

    let bad = Site::new(
        "127.0.0.1:1",
        std::path::Path::new("/nonexistent"),
        "JobNameInclude=^(?!cv-)",
    );
    let out = bad.run(&["check"]);
    assert!(
        stdout(&out).contains("JobNameExclude=^cv-"),
        "{}",
        stdout(&out)
    );
}

/// `check` looks at what a hook path really is, not at its name: the Python reference under
/// `cv-job-hook.py` is not cvslurm; a link to this binary is.
#[test]
fn check_looks_at_what_the_hook_is_not_its_name() {
    use std::os::unix::fs::PermissionsExt;
    let site = Site::new("127.0.0.1:1", std::path::Path::new("/nonexistent"), "");
    let py = site.dir.path().join("cv-job-hook.py");
    fs::write(
        &py,
        "#!/usr/bin/env python3\n\"\"\"cv-job-hook: the reference\"\"\"\nimport os\n",
    )
    .unwrap();
    fs::set_permissions(&py, fs::Permissions::from_mode(0o755)).unwrap();
    let link = site.link("cvslurm-hook");
    let text = site.check_with_slurm_conf(&format!(
        "ClusterName=c\nSlurmctldHost=localhost\nSlurmUser=root\nPrologSlurmctld={}\nEpilogSlurmctld={}\n",
        py.display(),
        link.display()
    ));
    assert!(
        text.contains(&format!(
            "FAIL PrologSlurmctld: {} is a Python script that does not call cvslurm-hook",
            py.display()
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "ok   EpilogSlurmctld={} runs cvslurm (",
            link.display()
        )) && text.contains("this very binary"),
        "{text}"
    );
}

/// Without EpilogSlurmctld (the PrologSlurmctld-only set-up), `check` says the service sends
/// the ends, and fails when `ReconcileInterval=0` would leave every end unsent.
#[test]
fn check_knows_the_prolog_only_set_up() {
    for (extra, want) in [
        (
            "ReconcileInterval=5",
            "ok   no EpilogSlurmctld: the PrologSlurmctld-only set-up; the service sends each job's end from slurmctld every 5 s (ReconcileInterval)",
        ),
        (
            "ReconcileInterval=0",
            "FAIL slurm.conf: no EpilogSlurmctld, and ReconcileInterval=0: no job's end would be sent",
        ),
        (
            "ReconcileInterval=300",
            "WARN ReconcileInterval=300 s without EpilogSlurmctld",
        ),
    ] {
        let site = Site::new("127.0.0.1:1", std::path::Path::new("/nonexistent"), extra);
        let link = site.link("cvslurm-hook");
        let text = site.check_with_slurm_conf(&format!(
            "ClusterName=c\nSlurmctldHost=localhost\nSlurmUser=root\nPrologSlurmctld={}\n",
            link.display()
        ));
        assert!(text.contains(want), "{extra}: {text}");
        assert!(
            !text.contains("no EpilogSlurmctld: add"),
            "{extra}: the set-up is not a missing hook: {text}"
        );
    }
}

/// A DiscoveryBcast copy runs only from a directory that only root and its user can write,
/// and only if it is byte for byte what inventory sent (issue 17, item 12: a copy in the
/// workers' /tmp could be planted by another user, who sees its name in srun's command line).
#[test]
fn broadcast_copy_verifies_itself() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = Scratch::new("bcast");
    let sys = tmp.path().join("sys");
    fs::create_dir(&sys).unwrap();
    let private = tmp.path().join("private");
    fs::create_dir(&private).unwrap();
    fs::set_permissions(&private, fs::Permissions::from_mode(0o700)).unwrap();
    let copy = private.join("cvslurm-discover.test");
    fs::copy(bin(), &copy).unwrap();
    let sum = std::process::Command::new("sha256sum")
        .arg(bin())
        .output()
        .unwrap();
    let sum = stdout(&sum).split_whitespace().next().unwrap().to_string();
    let run = |copy: &std::path::Path, expect: &str| {
        std::process::Command::new(copy)
            .args(["discover", "--node-name", "n1", "--sys-class-net"])
            .arg(&sys)
            .args(["--expect-sha256", expect])
            .output()
            .unwrap()
    };
    let out = run(&copy, &"0".repeat(64));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("is not the one inventory sent"),
        "{}",
        stderr(&out)
    );
    assert!(out.stdout.is_empty());
    let out = run(&copy, &sum);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("\"node_name\":\"n1\""));
    // The right bytes in a directory other users can write (as /tmp is, sticky or not): the
    // copy does not run.
    for mode in [0o1777, 0o777, 0o775] {
        fs::set_permissions(&private, fs::Permissions::from_mode(mode)).unwrap();
        let out = run(&copy, &sum);
        assert_eq!(out.status.code(), Some(1), "{mode:o}");
        assert!(
            stderr(&out).contains(&format!(
                "this copy's directory {} is open to other users ({} has mode {mode:o}): not \
                 running; set DiscoveryBcastDir to a directory only root and the user running \
                 the inventory can write",
                private.display(),
                private.display()
            )),
            "{}",
            stderr(&out)
        );
        assert!(out.stdout.is_empty());
    }
    fs::set_permissions(&private, fs::Permissions::from_mode(0o700)).unwrap();
    let mut dir = tmp.path().join("open");
    fs::create_dir(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
    dir.push("mine");
    fs::create_dir(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
    let nested = dir.join("cvslurm-discover.test");
    fs::copy(bin(), &nested).unwrap();
    let out = run(&nested, &sum);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("has mode 777): not running"),
        "a directory under one every user can rename: {}",
        stderr(&out)
    );
}
