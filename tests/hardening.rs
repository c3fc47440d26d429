//! Hardening (issue 11) through the binary: a config with bad lines, the token kept from Slurm
//! commands, files' modes, and the reference-parity details of the command line.

mod common;
use common::*;
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
        site.state_dir.join("jobs").is_dir(),
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
