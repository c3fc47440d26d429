//! On-prem CloudVision certificates: a self-signed certificate (CA:TRUE, as `openssl req -x509`
//! makes it) trusted exactly through `CaFile`, a key pin (`ApiServerPin`), and the messages for
//! a wrong, an expired and a misnamed certificate. The stand-in serves each certificate.

use crate::common::*;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A self-signed certificate with `CA:TRUE` made by `openssl ca -selfsign`, valid from
/// `start` to `end` (`YYYYMMDDHHMMSSZ`) for `san`. Returns (cert, key).
fn self_signed(dir: &Path, tag: &str, san: &str, start: &str, end: &str) -> (PathBuf, PathBuf) {
    let d = dir.join(tag);
    fs::create_dir_all(d.join("db")).unwrap();
    fs::write(d.join("db/index.txt"), "").unwrap();
    fs::write(d.join("db/serial"), "01\n").unwrap();
    fs::write(
        d.join("ca.cnf"),
        format!(
            "[ ca ]\ndefault_ca = d\n[ d ]\ndatabase = db/index.txt\nnew_certs_dir = db\n\
             serial = db/serial\ndefault_md = sha256\npolicy = p\nx509_extensions = e\n\
             [ p ]\ncommonName = supplied\n[ e ]\nbasicConstraints = critical, CA:TRUE\n\
             subjectAltName = {san}\n"
        ),
    )
    .unwrap();
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(&d)
            .output()
            .expect("openssl runs");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[
        "genpkey",
        "-algorithm",
        "EC",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-out",
        "key.pem",
    ]);
    run(&[
        "req",
        "-new",
        "-key",
        "key.pem",
        "-subj",
        "/CN=cloudvision",
        "-out",
        "r.csr",
    ]);
    run(&[
        "ca",
        "-batch",
        "-config",
        "ca.cnf",
        "-selfsign",
        "-keyfile",
        "key.pem",
        "-in",
        "r.csr",
        "-startdate",
        start,
        "-enddate",
        end,
        "-out",
        "cert.pem",
    ]);
    (d.join("cert.pem"), d.join("key.pem"))
}

const SAN: &str = "DNS:localhost, IP:127.0.0.1";
const FROM: &str = "20200101000000Z";
const UNTIL: &str = "20991231000000Z";

/// `sha256//<base64>` of a certificate's key, computed by openssl.
fn openssl_pin(cert: &Path) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "openssl x509 -in {} -noout -pubkey | openssl pkey -pubin -outform der | openssl dgst -sha256 -binary | base64",
            cert.display()
        ))
        .output()
        .unwrap();
    format!("sha256//{}", String::from_utf8_lossy(&out.stdout).trim())
}

/// Sends one tenant job; returns (exit code, stderr).
fn send(site: &Site) -> (Option<i32>, String) {
    let out = site.run(&[
        "send",
        "--tenant",
        "t-1",
        "--name",
        "n",
        "--location",
        "l",
        "--state",
        "running",
        "--start",
        "2025-12-05T10:30:00Z",
        "--nodes",
        "a1",
    ]);
    (out.status.code(), stderr(&out) + &stdout(&out))
}

/// The CloudVision line of `cvslurm check`.
fn check_line(site: &Site) -> String {
    let out = site.run(&["check"]);
    stdout(&out)
        .lines()
        .find(|l| l.contains("CloudVision 127.0.0.1"))
        .unwrap_or("")
        .to_string()
}

#[test]
fn self_signed_ca_true_certificate_in_cafile_is_trusted_exactly() {
    let tmp = Scratch::new("tls-self");
    let (cert, key) = self_signed(tmp.path(), "good", SAN, FROM, UNTIL);
    let cv = Standin::start_with(&[
        "--cert",
        cert.to_str().unwrap(),
        "--key",
        key.to_str().unwrap(),
    ]);
    let site = Site::new(&cv.server(), &cert, "");
    let (code, text) = send(&site);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        check_line(&site).contains("answers with the token"),
        "{}",
        check_line(&site)
    );

    // Another self-signed certificate in CaFile: refused, and the message says how to trust
    // exactly this server (with its pin).
    let (other, _) = self_signed(tmp.path(), "other", SAN, FROM, UNTIL);
    let site = Site::new(&cv.server(), &other, "");
    let (code, text) = send(&site);
    assert_eq!(code, Some(1), "{text}");
    let pin = openssl_pin(&cert);
    assert!(
        text.contains("not signed by a CA in CaFile") && text.contains(&pin),
        "{text}"
    );
    let line = check_line(&site);
    assert!(
        line.contains("ApiServerPin=") && line.starts_with("FAIL"),
        "{line}"
    );
}

#[test]
fn expired_and_misnamed_certificates_are_refused_with_the_reason() {
    let tmp = Scratch::new("tls-bad");
    let (old, old_key) = self_signed(tmp.path(), "old", SAN, FROM, "20200102000000Z");
    let cv = Standin::start_with(&[
        "--cert",
        old.to_str().unwrap(),
        "--key",
        old_key.to_str().unwrap(),
    ]);
    let site = Site::new(&cv.server(), &old, "");
    let (code, text) = send(&site);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("expired on 2020-01-02T00:00:00Z"), "{text}");
    assert!(
        check_line(&site).contains("expired"),
        "{}",
        check_line(&site)
    );
    drop(cv);

    let (named, named_key) = self_signed(tmp.path(), "named", "DNS:cv.example.com", FROM, UNTIL);
    let cv = Standin::start_with(&[
        "--cert",
        named.to_str().unwrap(),
        "--key",
        named_key.to_str().unwrap(),
    ]);
    let site = Site::new(&cv.server(), &named, "");
    let (code, text) = send(&site);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("certificate is for DnsName(\"cv.example.com\")")
            || text.contains("certificate is for cv.example.com"),
        "{text}"
    );
    assert!(text.contains("ApiServer says 127.0.0.1"), "{text}");
}

#[test]
fn api_server_pin_trusts_the_key_and_refuses_another() {
    let tmp = Scratch::new("tls-pin");
    let (cert, key) = self_signed(tmp.path(), "good", SAN, FROM, UNTIL);
    let cv = Standin::start_with(&[
        "--cert",
        cert.to_str().unwrap(),
        "--key",
        key.to_str().unwrap(),
    ]);
    let pin = openssl_pin(&cert);
    // No CaFile at all: the pin alone is the trust.
    let site = Site::new(&cv.server(), &cert, &format!("ApiServerPin={pin}"));
    let conf = fs::read_to_string(&site.conf).unwrap();
    let conf: String = conf
        .lines()
        .filter(|l| !l.starts_with("CaFile="))
        .map(|l| format!("{l}\n"))
        .collect();
    fs::write(&site.conf, conf).unwrap();
    let (code, text) = send(&site);
    assert_eq!(code, Some(0), "{text}");

    // A pin of another key refuses this server, even though CaFile would trust it.
    let (other, _) = self_signed(tmp.path(), "other", SAN, FROM, UNTIL);
    let site = Site::new(
        &cv.server(),
        &cert,
        &format!("ApiServerPin={}", openssl_pin(&other)),
    );
    let (code, text) = send(&site);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains(&format!(
            "the server's key {pin} is not the one ApiServerPin names"
        )),
        "{text}"
    );
    // A malformed pin is a bad line, reported with file:line:key, and it fails closed: no
    // request at all (the CA trust would have let this server have the token), and `check`
    // fails on the line and says why it does not connect.
    let site = Site::new(&cv.server(), &cert, "ApiServerPin=sha1//abc");
    let (code, text) = send(&site);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains(":10: ApiServerPin: \"sha1//abc\" is not sha256//"),
        "{text}"
    );
    assert!(
        text.contains("refusing to connect to CloudVision"),
        "{text}"
    );
    let out = site.run(&["check"]);
    assert!(stdout(&out).contains("FAIL config:"), "{}", stdout(&out));
    let line = check_line(&site);
    assert!(
        line.starts_with("FAIL") && line.contains("refusing to connect"),
        "{line}"
    );
}

/// a typo in the second pin of a list must not drop the whole line and
/// leave the client trusting any CA: the first pin refuses this server, so must the client.
/// Every TLS key fails closed alike: the hook keeps its event queued, `status` says why.
#[test]
fn a_bad_tls_line_refuses_to_connect() {
    let tmp = Scratch::new("tls-closed");
    // The stand-in's own certificate, signed by the CA in CaFile: trusted without pins.
    let cv = Standin::start();
    let (other, _) = self_signed(tmp.path(), "other", SAN, FROM, UNTIL);
    let typo = format!("ApiServerPin={}, sha256//not-base64!", openssl_pin(&other));
    for extra in [
        typo.as_str(),
        "Insecure=maybe",
        "CaFile=",
        "ApiServerPin sha256//x",
    ] {
        let site = Site::with_standin(&cv, extra);
        let (code, text) = send(&site);
        assert_eq!(code, Some(1), "{extra}: {text}");
        assert!(
            text.contains("refusing to connect to CloudVision") && text.contains(":10: "),
            "{extra}: {text}"
        );
        let (out, _) = site.hook(&job_env("prolog_slurmctld", "71", &[]));
        assert_eq!(out.status.code(), Some(0));
        assert_eq!(site.outbox().len(), 1, "{extra}: the event stays queued");
        assert!(site.log().contains("refusing to connect"), "{}", site.log());
        let out = site.run(&["status"]);
        assert_eq!(out.status.code(), Some(1), "{extra}");
        let line = stdout(&out)
            .lines()
            .find(|l| l.starts_with("CloudVision:"))
            .unwrap_or("")
            .to_string();
        assert!(line.contains("refusing to connect"), "{extra}: {line}");
    }
    assert_eq!(
        cv.requests().len(),
        0,
        "the token never left: {:?}",
        cv.requests()
    );
}
