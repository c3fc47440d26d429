//! Hardening through the binary: a config with bad lines, the token kept from Slurm
//! commands, files' modes, and the reference-parity details of the command line.

use crate::common::*;
use cvslurm::internals::state::layout;
use std::fs;
use std::time::Duration;

#[test]
fn a_bad_config_line_is_skipped_and_reported_the_rest_applies() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "Bogus=1\nHookTimeout=soon");
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
    let site = Site::offline("");
    let env_file = site.dir.path().join("scontrol.env");
    for name in ["scontrol", "sacct", "squeue", "sinfo", "srun"] {
        site.command(
            name,
            &format!("#!/bin/sh\nenv >> {}\nexit 1\n", env_file.display()),
        );
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
    let site = Site::with_standin(&cv, "");
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
    let site = Site::with_standin(&cv, "");
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
    assert_exit_0(&out);
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
    let site = Site::with_standin(&cv, "");
    let running = ["--state", "running", "--start", "2025-12-05T10:30:00Z"];
    let mut args = tenant_args(&running);
    args.extend(["--interfaces", "aa:bb:cc:dd:ee:01", "--dry-run"]);
    let out = site.run(&args);
    assert_exit_0(&out);
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
    assert_exit_0(&out);
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
    use cvslurm::cloudvision::payload::{JobConfig, JobState, Key};
    use cvslurm::cloudvision::{Client, ClientOptions, SendError};
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
    let site = Site::offline("");
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

    let bad = Site::offline("JobNameInclude=^(?!cv-)");
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
    let site = Site::offline("");
    let py = site.dir.path().join("cv-job-hook.py");
    write_executable(
        &py,
        "#!/usr/bin/env python3\n\"\"\"cv-job-hook: the reference\"\"\"\nimport os\n",
        0o755,
    );
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
        let site = Site::offline(extra);
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
/// and only if it is byte for byte what inventory sent (a copy in the
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
    install_executable(&bin(), &copy, 0o755);
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
    assert_exit_0(&out);
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
    install_executable(&bin(), &nested, 0o755);
    let out = run(&nested, &sum);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("has mode 777): not running"),
        "a directory under one every user can rename: {}",
        stderr(&out)
    );
}

// Worker text and a GPU node's sysfs.

/// A site whose Slurm is three scripts: `scontrol show config` names cluster c1, `sinfo` lists
/// node n1 idle, and `srun` runs `srun_body` (a shell script body) as the worker would answer.
fn fake_slurm_site(server: &str, ca: &std::path::Path, extra: &str, srun_body: &str) -> Site {
    let site = Site::new(server, ca, extra);
    for (name, body) in [
        ("scontrol", "printf 'ClusterName = c1\\n'"),
        ("sinfo", "echo 'n1 idle p1'"),
        ("srun", srun_body),
    ] {
        site.command(name, &format!("#!/bin/sh\n{body}\n"));
    }
    site
}

/// Runs `cvslurm inventory <args>` on `site`, under journald's conventions when `journald`.
fn inventory(site: &Site, args: &[&str], journald: bool) -> std::process::Output {
    let mut c = std::process::Command::new(bin());
    c.arg("inventory")
        .args(args)
        .env_remove("CV_API_TOKEN")
        .env_remove("CV_API_SERVER")
        .env_remove("JOURNAL_STREAM")
        .env("CVSLURM_CONF", &site.conf);
    if journald {
        c.env("JOURNAL_STREAM", "8:1234");
    }
    c.output().unwrap()
}

/// A worker's text cannot forge a log line nor drive a terminal: the key serde echoes in its
/// parse error and an interface name holding a newline, journald's `<3>` and an ESC sequence
/// come out escaped, one record per line, under journald and on a terminal alike. The bad
/// interface is dropped (and said), the node is kept with its other interface.
#[test]
fn a_workers_text_cannot_forge_log_lines_or_drive_the_terminal() {
    let scratch = Scratch::new("forge");
    let answer = scratch.path().join("worker.out");
    let forged_key = r#"0: {"node_name":"n1","hostname":"n1","location":null,"interfaces":[],"\n<3>forged entry\u001b[2J":1}"#;
    let bad_name = r#"0: {"node_name":"n1","hostname":"n1","location":null,"interfaces":[{"name":"eth0\n<3>x\u001b[2J","mac_address":"02:99:00:00:01:01","ip_addresses":["10.0.0.1"]},{"name":"eth1","mac_address":"02:99:00:00:01:02","ip_addresses":["10.0.0.2"]}]}"#;
    fs::write(&answer, format!("{forged_key}\n{bad_name}\n")).unwrap();
    let site = fake_slurm_site(
        "127.0.0.1:1",
        std::path::Path::new("/nonexistent"),
        "",
        &format!("cat {}", answer.display()),
    );
    for journald in [true, false] {
        let out = inventory(&site, &["--dry-run"], journald);
        let (text, err) = (stdout(&out), stderr(&out));
        assert_eq!(out.status.code(), Some(0), "{text}\n{err}");
        assert!(text.contains("\"name\": \"eth1\""), "{text}");
        assert!(
            !text.contains("eth0"),
            "the bad interface is not sent: {text}"
        );
        assert!(
            text.contains("inventory of cluster c1: 1 would send, 0 failed"),
            "{text}"
        );
        for (what, s) in [("stdout", &text), ("stderr", &err)] {
            assert!(!s.contains('\u{1b}'), "{what} holds a raw ESC: {s:?}");
        }
        let prefix = if journald { "<" } else { "cvslurm: " };
        for l in err.lines() {
            assert!(
                l.starts_with(prefix),
                "a forged or broken line: {l:?}\n{err}"
            );
            assert!(
                !l.starts_with("<3>forged") && !l.starts_with("<3>x"),
                "{err}"
            );
        }
        assert!(
            err.contains(r#"interface "eth0\n<3>x\u{1b}[2J" dropped: not a valid interface name"#),
            "{err}"
        );
        assert!(
            err.contains(r"\n<3>forged entry\x1b[2J"),
            "the parse error is logged, escaped: {err}"
        );
    }
}

/// A worker that floods stderr (512 KiB here; ~180 nodes of a noisy older
/// binary) does not cost the step its records: cvslurm drains srun's stderr past the 64 KiB it
/// keeps and says how much it dropped, and srun, never left writing to a closed pipe, is not
/// killed by SIGPIPE. The fake srun writes the flood, then a marker (only when that write
/// succeeded), then n1's record. Old code: stderr closed after 64 KiB, the write failed, and
/// n1 was not discovered.
#[test]
fn a_worker_flooding_stderr_does_not_kill_discovery() {
    let scratch = Scratch::new("stderr-flood");
    let answer = scratch.path().join("worker.out");
    let marker = scratch.path().join("stderr-written");
    fs::write(
        &answer,
        "0: {\"node_name\":\"n1\",\"hostname\":\"n1\",\"location\":null,\"interfaces\":[{\"name\":\"eth1\",\"mac_address\":\"02:99:00:00:01:02\",\"ip_addresses\":[\"10.0.0.2\"]}]}\n",
    )
    .unwrap();
    let site = fake_slurm_site(
        "127.0.0.1:1",
        std::path::Path::new("/nonexistent"),
        "",
        &format!(
            "yes 'worker: a noisy warning' | head -c 524288 >&2 || exit 1\n: > {}\ncat {}",
            marker.display(),
            answer.display()
        ),
    );
    let out = inventory(&site, &["--dry-run"], false);
    let (text, err) = (stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(0), "{text}\n{err}");
    assert!(marker.exists(), "srun's stderr write failed: {err}");
    assert!(
        text.contains("inventory of cluster c1: 1 would send, 0 failed"),
        "{text}\n{err}"
    );
    assert!(text.contains("\"name\": \"eth1\""), "{text}");
    assert!(
        err.contains("srun wrote 524288 bytes on stderr: the first 65536 kept, 458752 dropped"),
        "{err}"
    );
}

/// The hook's log file keeps one record per line too: a newline in `SLURM_JOB_ID` followed by
/// a timestamp does not start a line of its own, nor does journald's `<3>` under systemd.
#[test]
fn a_log_record_is_one_line_in_the_log_file_and_the_journal() {
    let site = Site::offline("");
    let id = "7\n2026-01-01T00:00:00Z cvslurm[1] ERROR forged\u{1b}[2J";
    let (out, _) = site.hook(&job_env("prolog_slurmctld", id, &[]));
    assert_eq!(out.status.code(), Some(0));
    let log = site.log();
    assert!(!log.is_empty());
    for l in log.lines() {
        assert!(!l.starts_with("2026-01-01T00:00:00Z cvslurm[1]"), "{log}");
    }
    assert!(!log.contains('\u{1b}'), "{log:?}");
    assert!(
        log.contains(r"job 7\n2026-01-01T00:00:00Z cvslurm[1] ERROR forged\x1b[2J: not sent"),
        "{log}"
    );
    let id = "7\n<3>forged";
    let (out, _) = site.hook(&job_env(
        "prolog_slurmctld",
        id,
        &[("JOURNAL_STREAM", "8:1234")],
    ));
    assert_eq!(out.status.code(), Some(0));
    let err = stderr(&out);
    assert!(err.contains(r"job 7\n<3>forged: not sent"), "{err}");
    assert!(err.lines().all(|l| !l.starts_with("<3>forged")), "{err}");
}

/// `discover` skips an interface whose name Linux's rules (and ours: no control characters)
/// refuse, says so escaped, and reports the others.
#[test]
fn discover_skips_an_interface_with_an_invalid_name() {
    let scratch = Scratch::new("ifname");
    for (name, mac) in [
        ("eth0", "02:99:00:00:01:01"),
        ("eth1\u{1b}[2J", "02:99:00:00:01:02"),
    ] {
        let d = scratch.path().join(name);
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join("address"), format!("{mac}\n")).unwrap();
    }
    let out = std::process::Command::new(bin())
        .args(["discover", "--node-name", "n1", "--sys-class-net"])
        .arg(scratch.path())
        .args(["--physical-only", "no", "--require-ip", "no"])
        .output()
        .unwrap();
    assert_exit_0(&out);
    let rec =
        cvslurm::internals::discovery::record::DiscoverRecord::parse_line(stdout(&out).trim())
            .unwrap();
    let names: Vec<&str> = rec.interfaces.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["eth0"]);
    let err = stderr(&out);
    assert!(
        err.contains(r#"interface "eth1\u{1b}[2J" skipped: not a valid interface name"#),
        "{err}"
    );
    assert!(!err.contains('\u{1b}'), "{err:?}");
}

/// A sysfs/procfs tree from tests/fixtures/topology/gen.sh, with its environment variables.
fn topology_tree(scratch: &Scratch, layout: &str, env: &[(&str, &str)]) -> std::path::PathBuf {
    let dir = scratch.path().join(layout);
    let gen =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/topology/gen.sh");
    let st = std::process::Command::new("bash")
        .arg(gen)
        .arg(layout)
        .arg(&dir)
        .arg("02:dd:00:07")
        .envs(env.iter().copied())
        .status()
        .unwrap();
    assert!(st.success());
    dir
}

/// `cvslurm discover --topology` on a tree: (exit code, the record put together from its
/// parts, stderr).
fn discover_topology(
    root: &std::path::Path,
) -> (
    Option<i32>,
    Option<cvslurm::internals::discovery::record::DiscoverRecord>,
    String,
) {
    let out = std::process::Command::new(bin())
        .args([
            "discover",
            "--node-name",
            "n1",
            "--topology",
            "--require-ip",
            "no",
        ])
        .arg("--sys-root")
        .arg(root)
        .output()
        .unwrap();
    let mut r = cvslurm::internals::discovery::record::RecordReader::new(1 << 20, 1 << 22);
    let rec = stdout(&out)
        .lines()
        .filter(|l| !l.is_empty())
        .find_map(|l| r.push(l))
        .map(|x| x.unwrap());
    (out.status.code(), rec, stderr(&out))
}

/// GPU SR-IOV virtual functions are not GPUs: a DGX A100 with 16 per GPU reports its 8 GPUs
/// (before, "more than 64 GPUs" failed discover and the node lost its NodeConfig). A GPU bound
/// to no driver is skipped and the others keep their driver minors (before, all went to PCI
/// order, so GPUs 2-3 named the NICs of other GPUs).
#[test]
fn discover_counts_only_gpus_a_job_can_hold() {
    let scratch = Scratch::new("gpus");
    let vfs = topology_tree(&scratch, "dgx-a100", &[("GPU_VFS", "16")]);
    let (code, rec, err) = discover_topology(&vfs);
    assert_eq!(code, Some(0), "{err}");
    let rec = rec.unwrap();
    let t = rec.topology.as_ref().unwrap();
    assert_eq!(
        t.gpus.iter().map(|g| g.index).collect::<Vec<_>>(),
        (0..8).collect::<Vec<_>>()
    );
    assert_eq!(rec.interfaces.len(), 10);
    let driverless = topology_tree(&scratch, "two-socket", &[("DRIVERLESS", "0000:17:00.0")]);
    let (code, rec, err) = discover_topology(&driverless);
    assert_eq!(code, Some(0), "{err}");
    let t = rec.unwrap().topology.unwrap();
    let idx: Vec<(u32, &str)> = t.gpus.iter().map(|g| (g.index, g.pci.as_str())).collect();
    assert_eq!(
        idx,
        [
            (1, "0000:31:00.0"),
            (2, "0000:98:00.0"),
            (3, "0000:b1:00.0")
        ]
    );
    assert_eq!(t.nic("ens7f0").unwrap().gpus, [2, 3]);
    assert!(
        err.contains("GPU 0000:17:00.0 skipped: bound to no driver"),
        "{err}"
    );
}

/// A node never loses its record over its topology: when the GPUs cannot be numbered (bound
/// to nvidia, but no device minor to read), discover prints the record without topology and
/// says why (stderr and `topology_error`); the inventory sends the node's NodeConfig, keeps the
/// record and logs the reason.
#[test]
fn a_topology_that_cannot_be_read_does_not_lose_the_node() {
    let scratch = Scratch::new("topofail");
    let tree = topology_tree(&scratch, "two-socket", &[]);
    fs::remove_dir_all(tree.join("proc/driver")).unwrap();
    let (code, rec, err) = discover_topology(&tree);
    assert_eq!(code, Some(0), "{err}");
    let rec = rec.unwrap();
    assert_eq!(rec.interfaces.len(), 5);
    assert!(rec.topology.is_none());
    let why = rec.topology_error.clone().unwrap();
    assert!(
        why.contains("GPU 0000:17:00.0: no device minor in"),
        "{why}"
    );
    assert!(
        err.contains("GPU topology not reported: GPU 0000:17:00.0"),
        "{err}"
    );

    let cv = Standin::start();
    let site = fake_slurm_site(
        &cv.server(),
        &cv.ca(),
        "JobInterfaces=gpu\nInterfaceRequireIp=no",
        &format!(
            "{} discover --node-name n1 --sys-root {} --topology --require-ip no | sed 's/^/0: /'",
            bin().display(),
            tree.display()
        ),
    );
    let out = inventory(&site, &[], false);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{}\n{err}", stdout(&out));
    let sent = cv.accepted("NodeConfig");
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(
        sent[0]["data_interfaces"]["values"]
            .as_array()
            .unwrap()
            .len(),
        5
    );
    assert!(
        err.contains("node n1: no GPU topology (its jobs go by node name): GPU 0000:17:00.0"),
        "{err}"
    );
    let kept = fs::read_to_string(site.state_dir.join(layout::NODES).join("n1.json")).unwrap();
    let kept = cvslurm::internals::discovery::record::DiscoverRecord::parse_line(&kept).unwrap();
    assert_eq!(kept.topology_error, Some(why));
}

/// What CloudVision (or a proxy) answers and what SlurmUser writes in
/// `service-status.json` reach root's terminal through `flush` and `status`: escape sequences
/// there are printed as visible escapes, and the server's message is stored on one line,
/// capped.
#[test]
fn server_and_state_dir_text_cannot_rewrite_the_terminal() {
    use serde_json::json;
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "");
    let evil = format!(
        "\x1b[2J\x1b[H\rALL OK\nnothing waiting {}",
        "x".repeat(5000)
    );
    cv.set_mode(json!({"mode": "status", "status": 503, "message": evil}));
    let (out, _) = site.hook(&job_env("prolog_slurmctld", "51", &[]));
    assert_eq!(out.status.code(), Some(0));
    let out = site.run(&["flush", "--no-reconcile"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = stdout(&out);
    let raw = |t: &str| t.contains('\x1b') || t.contains('\r');
    assert!(!raw(&text), "{text:?}");
    assert_eq!(text.lines().count(), 1, "{text:?}");
    assert!(
        text.contains("\\x1b[2J\\x1b[H ALL OK nothing waiting"),
        "{text}"
    );
    assert!(
        text.len() < 2000,
        "the message is capped: {} bytes",
        text.len()
    );

    let status_file = site.state_dir.join(layout::SERVICE_STATUS);
    let stored: serde_json::Value =
        serde_json::from_slice(&fs::read(&status_file).unwrap()).unwrap();
    let last = stored["last_error"].as_str().unwrap();
    assert!(!raw(last) && !last.contains('\n'), "{last:?}");
    assert!(last.chars().count() <= 1000, "{}", last.len());

    // SlurmUser writes the file `status` reads.
    fs::write(
        &status_file,
        json!({
            "last_error": "\x1b[1A\x1b[2Koutbox: 0 event(s) waiting\r\nCloudVision: ok\u{9b}2J",
            "last_error_at": 1,
        })
        .to_string(),
    )
    .unwrap();
    let out = site.run(&["status", "--offline"]);
    let text = stdout(&out);
    assert!(!raw(&text) && !text.contains('\u{9b}'), "{text:?}");
    assert!(
        text.contains("last error:       \\x1b[1A\\x1b[2Koutbox: 0 event(s) waiting CloudVision: ok\\u{9b}2J at"),
        "{text}"
    );
}

/// One Latin-1 byte in a comment (`# Géré par Puppet`, byte 0xE9) no
/// longer discards the whole cloudvision.conf. A key line with such a byte is a bad line like
/// any other: reported, the others apply.
#[test]
fn a_latin1_byte_spoils_at_most_its_own_line() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "");
    let mut bytes = b"# G\xe9r\xe9 par Puppet\n".to_vec();
    bytes.extend(fs::read(&site.conf).unwrap());
    bytes.extend(b"Partitions=caf\xe9 # d\xe9j\xe0\n");
    fs::write(&site.conf, &bytes).unwrap();
    let bad_line = bytes.split(|b| *b == b'\n').count() - 1;

    let (out, _) = site.hook(&job_env("prolog_slurmctld", "61", &[]));
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        cv.accepted("JobConfig").len(),
        1,
        "the file applies: {}",
        site.log()
    );
    let log = site.log();
    let conf = site.conf.display().to_string();
    assert!(
        log.contains(&format!(
            "{conf}:{bad_line}: Partitions: not UTF-8 text (byte 0xE9 at column 15)"
        )),
        "{log}"
    );
    assert!(
        !log.contains(&format!("{conf}:1:")),
        "the comment is a comment: {log}"
    );

    for args in [&["status", "--offline"][..], &["flush", "--no-reconcile"]] {
        let out = site.run(args);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
    }
    let out = site.run(&["check"]);
    let text = stdout(&out);
    assert!(
        text.contains(&format!(
            "FAIL config: {conf}:{bad_line}: Partitions: not UTF-8"
        )),
        "{text}"
    );
    assert!(text.contains("every other line loads"), "{text}");
}

/// A relative path in the config would name another file for the hook
/// (slurmctld's working directory), the service (`/`) and the admin's commands. It is a bad
/// line naming the key: here the hook, run in the directory where `token` is, must not read
/// it; it exits 0 and keeps the event, which `flush` sends once the line is fixed.
#[test]
fn relative_paths_in_the_config_are_errors_naming_the_key() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "");
    let good = fs::read_to_string(&site.conf).unwrap();
    let abs = format!("ApiTokenFile={}", site.token_file.display());
    assert!(good.contains(&abs));
    fs::write(&site.conf, good.replace(&abs, "ApiTokenFile=token")).unwrap();
    assert!(
        site.dir.path().join("token").is_file(),
        "the hook's working directory"
    );

    let (out, _) = site.hook(&job_env("prolog_slurmctld", "81", &[]));
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(cv.accepted("JobConfig").len(), 0, "{}", site.log());
    assert_eq!(site.outbox().len(), 1, "the event is kept: {}", site.log());
    let log = site.log();
    assert!(
        log.contains(&format!(
            "{}:3: ApiTokenFile: \"token\" is a relative path: use an absolute path",
            site.conf.display()
        )),
        "{log}"
    );

    // `check` names every relative path key.
    let text = fs::read_to_string(&site.conf).unwrap();
    fs::write(
        &site.conf,
        format!("{text}StateDir=var/spool/cvslurm\nLogFile=./cvjob.log\nSlurmBinDir=bin\n"),
    )
    .unwrap();
    let out = site.run(&["check"]);
    let report = stdout(&out);
    assert_eq!(out.status.code(), Some(1));
    for key in ["ApiTokenFile", "StateDir", "LogFile", "SlurmBinDir"] {
        assert!(
            report.lines().any(|l| l.starts_with("FAIL config:")
                && l.contains(&format!("{key}: "))
                && l.contains("is a relative path: use an absolute path")),
            "{key}: {report}"
        );
    }
    // The environment's log file too (with the good config: nothing else is wrong).
    fs::write(&site.conf, &good).unwrap();
    let out = std::process::Command::new(bin())
        .args(["flush", "--no-reconcile"])
        .env("CVSLURM_CONF", &site.conf)
        .env("CV_LOG_FILE", "cvjob.log")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("CV_LOG_FILE: \"cvjob.log\" is a relative path"),
        "{}",
        stderr(&out)
    );

    let out = site.run(&["flush", "--no-reconcile"]);
    assert_exit_0(&out);
    assert_eq!(cv.accepted("JobConfig").len(), 1);
}

/// A slurm.conf naming `nobody` as SlurmUser, in the site's directory; its path.
fn slurm_conf_nobody(site: &Site) -> std::path::PathBuf {
    let p = site.dir.path().join("slurm.conf");
    fs::write(
        &p,
        "ClusterName=c\nSlurmctldHost=localhost\nSlurmUser=nobody\n",
    )
    .unwrap();
    p
}

/// A `root:slurm 0770` StateDir (group-writable by SlurmUser, which `check` used to call
/// fine): root must not stay root in it and follow SlurmUser's links.
#[test]
fn root_refuses_a_state_dir_others_can_write() {
    use std::os::unix::fs::{symlink, PermissionsExt};
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let nobody = 65534;
    let cv = Standin::start();
    let site = Site::new("127.0.0.1:1", &cv.ca(), "");
    let slurm_conf = slurm_conf_nobody(&site);
    let root_dir = site.dir.path();
    fs::create_dir(&site.state_dir).unwrap();
    std::os::unix::fs::chown(&site.state_dir, Some(0), Some(nobody)).unwrap();
    fs::set_permissions(&site.state_dir, fs::Permissions::from_mode(0o770)).unwrap();
    // What SlurmUser (group member) plants: a lock file that creates a file anywhere, an
    // outbox that is root's private directory.
    let created = root_dir.join("created-by-root");
    symlink(&created, site.state_dir.join(layout::OUTBOX_LOCK)).unwrap();
    let private = root_dir.join("private");
    fs::create_dir(&private).unwrap();
    fs::set_permissions(&private, fs::Permissions::from_mode(0o700)).unwrap();
    fs::write(private.join("secret.json"), "not an event\n").unwrap();
    symlink(&private, site.state_dir.join(layout::OUTBOX)).unwrap();
    let out = site.run_with_slurm_conf(&slurm_conf, &["flush", "--no-reconcile"]);
    let said = stderr(&out);
    assert!(
        !created.exists(),
        "root created a file through a link: {said}"
    );
    assert!(
        private.join("secret.json").exists(),
        "root moved a file out of its private directory: {said}"
    );
    assert_ne!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("writable by"), "{said}");
    // And `check` says so.
    let check =
        site.check_with_slurm_conf("ClusterName=c\nSlurmctldHost=localhost\nSlurmUser=nobody\n");
    assert!(
        check
            .lines()
            .any(|l| l.contains("StateDir") && l.contains("writable by group")),
        "{check}"
    );
}

/// StateDir named through a link in a directory SlurmUser owns, swapped after the root
/// service started: the service keeps working in the directory it checked at start, and
/// never goes where the new link points.
#[test]
fn root_service_keeps_the_state_dir_it_checked() {
    use std::os::unix::fs::symlink;
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let nobody = 65534;
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "");
    let root_dir = site.dir.path();
    // The real StateDir: root's own. The configured name: a link in SlurmUser's directory.
    let real = root_dir.join("real-state");
    fs::create_dir(&real).unwrap();
    let parent = root_dir.join("slurm-owned");
    fs::create_dir(&parent).unwrap();
    std::os::unix::fs::chown(&parent, Some(nobody), Some(nobody)).unwrap();
    let link = parent.join("state");
    symlink(&real, &link).unwrap();
    let conf = fs::read_to_string(&site.conf).unwrap().replace(
        &format!("StateDir={}", site.state_dir.display()),
        &format!("StateDir={}", link.display()),
    );
    fs::write(&site.conf, &conf).unwrap();
    let evil = root_dir.join("evil");
    fs::create_dir(&evil).unwrap();
    let created = root_dir.join("created-by-root");
    symlink(&created, evil.join(layout::OUTBOX_LOCK)).unwrap();
    let service = std::process::Command::new(bin())
        .args(["inventory", "--monitor"])
        .env_remove("CV_API_TOKEN")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("JOURNAL_STREAM")
        .env("CVSLURM_CONF", &site.conf)
        .env("SLURM_CONF", site.no_slurm_conf())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _service = Kill(service);
    wait_for("the service's socket", Duration::from_secs(20), || {
        real.join(layout::WAKE_SOCKET).exists()
    });
    // SlurmUser swaps the link.
    fs::remove_file(&link).unwrap();
    symlink(&evil, &link).unwrap();
    // A hook that writes to the real StateDir.
    let direct = site.dir.path().join("direct.conf");
    fs::write(
        &direct,
        conf.replace(
            &format!("StateDir={}", link.display()),
            &format!("StateDir={}", real.display()),
        ),
    )
    .unwrap();
    let out = std::process::Command::new(site.link("cvslurm-hook"))
        .env_clear()
        .env("CVSLURM_CONF", &direct)
        .envs(job_env("prolog_slurmctld", "31", &[]))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    wait_for(
        "the service to deliver the event in the StateDir it checked",
        Duration::from_secs(20),
        || !cv.accepted("JobConfig").is_empty(),
    );
    assert!(!created.exists(), "the service followed the swapped link");
    assert_eq!(
        fs::read_dir(&evil).unwrap().count(),
        1,
        "nothing written in evil/"
    );
}

/// Root drops to StateDir's owner's own identity (its passwd entry: primary group and
/// supplementary groups), never to StateDir's group: with `install -d -o slurm` that group
/// is root's. The Slurm commands it runs say who they run as.
#[test]
fn root_drops_to_the_owners_own_groups_not_the_state_dirs() {
    use std::os::unix::fs::PermissionsExt;
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let nobody = 65534;
    let cv = Standin::start();
    let site = Site::new("127.0.0.1:1", &cv.ca(), "");
    let slurm_conf = slurm_conf_nobody(&site);
    fs::create_dir(&site.state_dir).unwrap();
    std::os::unix::fs::chown(&site.state_dir, Some(nobody), Some(0)).unwrap();
    fs::set_permissions(&site.state_dir, fs::Permissions::from_mode(0o700)).unwrap();
    let seen = site.dir.path().join("seen");
    fs::create_dir(&seen).unwrap();
    fs::set_permissions(&seen, fs::Permissions::from_mode(0o777)).unwrap();
    for cmd in ["squeue", "scontrol", "sacct", "sinfo"] {
        site.command(
            cmd,
            &format!(
                "#!/bin/sh\necho \"$(id -u) $(id -g) $(id -G)\" > {}/{cmd}\nexit 1\n",
                seen.display()
            ),
        );
    }
    let out = site.run_with_slurm_conf(&slurm_conf, &["flush"]);
    let said = stderr(&out);
    let ids: Vec<String> = fs::read_dir(&seen)
        .unwrap()
        .flatten()
        .map(|e| fs::read_to_string(e.path()).unwrap().trim().to_string())
        .collect();
    assert!(!ids.is_empty(), "no Slurm command ran: {said}");
    for id in ids {
        assert_eq!(id, "65534 65534 65534", "uid, gid, groups: {said}");
    }
    // An owner that is not SlurmUser: refused.
    let other = site.dir.path().join("slurm-root.conf");
    fs::write(&other, "ClusterName=c\nSlurmUser=root\n").unwrap();
    let out = site.run_with_slurm_conf(&other, &["flush", "--no-reconcile"]);
    assert_ne!(out.status.code(), Some(0));
    assert!(stderr(&out).contains("not SlurmUser"), "{}", stderr(&out));
    // No slurm.conf to tell who SlurmUser is: refused, and said so.
    let missing = site.dir.path().join("no-such-slurm.conf");
    let out = site.run_with_slurm_conf(&missing, &["flush", "--no-reconcile"]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        stderr(&out).contains("cannot read slurm.conf"),
        "{}",
        stderr(&out)
    );
}
