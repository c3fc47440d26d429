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
