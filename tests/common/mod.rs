//! Shared test helpers: the CloudVision stand-in, a scratch site (config, token, state dir,
//! log), and running the built binary the way Slurm runs it.
#![allow(dead_code)]

use serde_json::Value;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use cvslurm::cloudvision::{Client, ClientOptions};
use cvslurm::config::Token;
use cvslurm::internals::state::layout;

pub const TOKEN: &str = "test-token-5ecr3t";

/// The built binary.
pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_cvslurm"))
}

/// A scratch directory removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let d = std::env::temp_dir().join(format!(
            "cvslurm-it-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// The CloudVision stand-in, stopped on drop.
pub struct Standin {
    child: Child,
    pub dir: Scratch,
    pub port: u16,
    client: Client,
}

/// The stand-in's two rule sets a test runs against: CloudVision's contract (a Set merges)
/// and Arista's own fake CloudVision (every POST a whole record that replaces the stored one;
/// no GET, no JobConfig delete).
pub const PROFILES: [&str; 2] = ["cloudvision", "arista"];

impl Standin {
    pub fn start() -> Standin {
        Standin::start_with(&[])
    }

    /// A stand-in started with extra command-line arguments (e.g. `--cert`, `--key`).
    pub fn start_with(extra: &[&str]) -> Standin {
        let dir = Scratch::new("standin");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/standin/cv_standin.py");
        // Its output goes to a file: a stand-in that outlives the test process (the e2e
        // fixture's) must not hold the test runner's pipes open.
        let log = fs::File::create(dir.path().join("standin.log")).unwrap();
        let child = Command::new("python3")
            .arg(&script)
            .args([
                "--dir",
                dir.path().to_str().unwrap(),
                "--port",
                "0",
                "--token",
                TOKEN,
            ])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("python3 runs the stand-in");
        let port_file = dir.path().join("port");
        let until = Instant::now() + Duration::from_secs(20);
        let port = loop {
            if let Ok(s) = fs::read_to_string(&port_file) {
                if let Ok(p) = s.trim().parse::<u16>() {
                    break p;
                }
            }
            assert!(
                Instant::now() < until,
                "stand-in did not start: {}",
                fs::read_to_string(dir.path().join("standin.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let client = Client::new(ClientOptions {
            server: format!("127.0.0.1:{port}"),
            token: Token::new(TOKEN),
            ca_file: Some(dir.path().join("ca.pem")),
            pins: Vec::new(),
            insecure: false,
            timeout: Duration::from_secs(10),
        })
        .unwrap();
        Standin {
            child,
            dir,
            port,
            client,
        }
    }

    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn server(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// A control call. Answers can be large (the whole request log), larger than the product
    /// client reads, so GETs go through curl.
    fn control(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let url = format!("https://127.0.0.1:{}/_standin/{path}", self.port);
        if method == "GET" {
            let out = Command::new("curl")
                .args(["-sS", "--fail", "--cacert"])
                .arg(self.ca())
                .arg(&url)
                .output()
                .expect("curl runs");
            assert!(
                out.status.success(),
                "curl {url}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            return serde_json::from_slice(&out.stdout).expect("stand-in answers JSON");
        }
        let bytes = body.map(|b| serde_json::to_vec(&b).unwrap());
        let a = self
            .client
            .call(method, &url, bytes.as_deref(), None)
            .expect("stand-in control call");
        serde_json::from_str(&a.body).unwrap_or(Value::Null)
    }

    /// Every API request so far.
    pub fn requests(&self) -> Vec<Value> {
        match self.control("GET", "requests", None) {
            Value::Array(v) => v,
            other => panic!("unexpected requests answer {other}"),
        }
    }

    /// Bodies of accepted POSTs to a path ending in `kind` (`JobConfig`, `NodeConfig`).
    pub fn accepted(&self, kind: &str) -> Vec<Value> {
        self.requests()
            .into_iter()
            .filter(|r| {
                r["method"] == "POST"
                    && r["path"].as_str().unwrap_or("").ends_with(kind)
                    && r["status"] == 200
            })
            .map(|r| r["body"].clone())
            .collect()
    }

    pub fn state(&self) -> Value {
        self.control("GET", "state", None)
    }

    pub fn set_mode(&self, mode: Value) {
        self.control("POST", "mode", Some(mode));
    }

    pub fn reset(&self) {
        self.control("POST", "reset", Some(serde_json::json!({})));
    }

    /// Forgets these jobs' records (keys), as if deleted; every other record and the
    /// request log stay.
    pub fn forget_jobs(&self, keys: &[String]) {
        self.control("POST", "forget", Some(serde_json::json!({ "jobs": keys })));
    }

    /// Switches some of the stand-in's behaviours away from the contract (see
    /// tests/standin/README.md, "Behaviours"); a test that does so says why.
    pub fn set_behaviour(&self, behaviour: Value) {
        let now = self.control("POST", "behaviour", Some(behaviour.clone()));
        for (k, v) in behaviour.as_object().expect("a behaviour is a JSON object") {
            assert_eq!(&now[k], v, "the stand-in took behaviour {k}: {now}");
        }
    }

    /// A stand-in with `profile`'s rules (tests/standin/README.md, "Profiles").
    pub fn start_profile(profile: &str) -> Standin {
        let s = Standin::start();
        s.set_behaviour(serde_json::json!({ "profile": profile }));
        s
    }

    /// Asserts that every JobConfig POST so far named exactly one of `nodes` and `interfaces`,
    /// its list not empty, and was accepted (what Arista's own fake CloudVision requires).
    pub fn assert_one_list_each(&self) {
        for r in self.requests() {
            if r["method"] != "POST" || !r["path"].as_str().unwrap_or("").ends_with("JobConfig") {
                continue;
            }
            let b = &r["body"];
            let lists: Vec<&str> = ["nodes", "interfaces"]
                .into_iter()
                .filter(|f| b.get(*f).is_some())
                .collect();
            assert_eq!(lists.len(), 1, "not exactly one list: {r}");
            let values = b[lists[0]]["values"].as_array();
            assert!(values.is_some_and(|v| !v.is_empty()), "an empty list: {r}");
            assert_eq!(r["status"], 200, "refused: {r}");
        }
    }

    /// The stored JobConfig `id` (what a GetOne would answer, in the requests' snake_case).
    pub fn stored_job(&self, id: &str) -> Option<Value> {
        self.state()["jobs"].get(id).cloned()
    }

    /// The stored NodeConfig `id`, in the requests' snake_case.
    pub fn stored_node(&self, id: &str) -> Option<Value> {
        self.state()["nodes"].get(id).cloned()
    }
}

impl Drop for Standin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A controller's files: cloudvision.conf, token file, state dir and log, in a scratch dir.
pub struct Site {
    pub dir: Scratch,
    pub conf: PathBuf,
    pub token_file: PathBuf,
    pub state_dir: PathBuf,
    pub log_file: PathBuf,
    pub bin_dir: PathBuf,
    /// `extra` names a `SlurmBinDir` of its own: a real Slurm cluster's commands, which read
    /// the machine's slurm.conf (so `SLURM_CONF` is left alone).
    real_slurm: bool,
}

impl Site {
    /// A site talking to the stand-in `cv`; `extra` lines are appended to its config.
    pub fn with_standin(cv: &Standin, extra: &str) -> Site {
        Site::new(&cv.server(), &cv.ca(), extra)
    }

    /// A site whose CloudVision nothing answers (`127.0.0.1:1`, no CA file): for what runs
    /// without one (`check`, `status --offline`, the hook's queueing).
    pub fn offline(extra: &str) -> Site {
        Site::new("127.0.0.1:1", Path::new("/nonexistent"), extra)
    }

    /// A site talking to `server` with the stand-in's CA; `extra` lines are appended.
    pub fn new(server: &str, ca: &Path, extra: &str) -> Site {
        let dir = Scratch::new("site");
        let token_file = dir.path().join("token");
        fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
        fs::set_permissions(&token_file, fs::Permissions::from_mode(0o600)).unwrap();
        let state_dir = dir.path().join("state");
        let log_file = dir.path().join("cvjob.log");
        let bin_dir = dir.path().join("bin");
        fs::create_dir_all(&bin_dir).unwrap();
        let conf = dir.path().join("cloudvision.conf");
        fs::write(
            &conf,
            format!(
                "# test site\nApiServer={server}\nApiTokenFile={}\nCaFile={}\nStateDir={}\nLogFile={}\n\
                 SlurmBinDir={}\nHookTimeout=2\nLogLevel=debug\n{extra}\n",
                token_file.display(),
                ca.display(),
                state_dir.display(),
                log_file.display(),
                bin_dir.display()
            ),
        )
        .unwrap();
        Site {
            dir,
            conf,
            token_file,
            state_dir,
            log_file,
            bin_dir,
            real_slurm: extra.contains("SlurmBinDir="),
        }
    }

    pub fn log(&self) -> String {
        fs::read_to_string(&self.log_file).unwrap_or_default()
    }

    /// Writes `script` (whole, its `#!` line included) as the Slurm command `name` of this
    /// site (`SlurmBinDir`), executable ([`write_executable`]).
    pub fn command(&self, name: &str, script: &str) {
        write_executable(&self.bin_dir.join(name), script, 0o755);
    }

    /// A symlink to the binary named `name` (argv[0] dispatch).
    pub fn link(&self, name: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        match std::os::unix::fs::symlink(bin(), &p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => panic!("symlink {}: {e}", p.display()),
        }
        p
    }

    /// The pending events as the outbox's drainer will send them: one per job or node, the
    /// files hooks handed in (`<kind>.<key>.<seq>.<pid>.<n>.%.json`) applied to their key's
    /// pending file in order, as the drainer takes them in. A file that is no event of this
    /// cvslurm's formats (a newer one) is listed as it is.
    pub fn outbox(&self) -> Vec<Value> {
        cvslurm::internals::state::queue::outbox_view(&self.state_dir.join(layout::OUTBOX))
    }

    /// Runs the hook as slurmctld does: empty environment but the given SLURM_* variables
    /// (and CVSLURM_CONF pointing at this site), no arguments, argv[0] `cvslurm-hook`.
    pub fn hook(&self, vars: &[(&str, &str)]) -> (Output, Duration) {
        let link = self.link("cvslurm-hook");
        let mut c = Command::new(link);
        c.env_clear()
            .env("CVSLURM_CONF", &self.conf)
            .current_dir(self.dir.path());
        for (k, v) in vars {
            c.env(k, v);
        }
        let t = Instant::now();
        let out = c.output().unwrap();
        (out, t.elapsed())
    }

    /// Runs `cvslurm check` with this site's config and a slurm.conf holding `slurm_conf`
    /// (written in the site's directory); returns what it printed.
    pub fn check_with_slurm_conf(&self, slurm_conf: &str) -> String {
        let path = self.dir.path().join("slurm.conf");
        fs::write(&path, slurm_conf).unwrap();
        let out = Command::new(bin())
            .arg("check")
            .env_remove("CV_API_TOKEN")
            .env_remove("CV_API_SERVER")
            .env("CVSLURM_CONF", &self.conf)
            .env("SLURM_CONF", &path)
            .output()
            .unwrap();
        stdout(&out)
    }

    /// Runs `cvslurm <args>` with this site's config (and no slurm.conf: see
    /// [`Site::no_slurm_conf`]).
    pub fn run(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new(bin());
        cmd.args(args)
            .env_remove("CV_API_TOKEN")
            .env_remove("CV_API_SERVER")
            .env("CVSLURM_CONF", &self.conf);
        self.slurm_conf_env(&mut cmd);
        cmd.output().unwrap()
    }

    /// Runs `cvslurm <args>` with this site's config and `SLURM_CONF` at `slurm_conf`.
    pub fn run_with_slurm_conf(&self, slurm_conf: &Path, args: &[&str]) -> Output {
        Command::new(bin())
            .args(args)
            .env_remove("CV_API_TOKEN")
            .env("CVSLURM_CONF", &self.conf)
            .env("SLURM_CONF", slurm_conf)
            .output()
            .unwrap()
    }

    /// `SLURM_CONF` naming no file ([`Site::no_slurm_conf`]), unless the site runs a real
    /// Slurm cluster's commands, which need the machine's slurm.conf.
    pub fn slurm_conf_env(&self, cmd: &mut Command) {
        if !self.real_slurm {
            cmd.env("SLURM_CONF", self.no_slurm_conf());
        }
    }

    /// A `SLURM_CONF` that names no file: the site is one controller whatever this machine's
    /// /etc/slurm/slurm.conf holds (a test cluster's pair, up meanwhile, would make the
    /// site's processes a controller that does not lead).
    pub fn no_slurm_conf(&self) -> PathBuf {
        self.dir.path().join("no-slurm.conf")
    }
}

/// The hook environment of a job.
pub fn job_env<'a>(
    context: &'a str,
    id: &'a str,
    extra: &[(&'a str, &'a str)],
) -> Vec<(&'a str, &'a str)> {
    let mut v = vec![
        ("SLURM_SCRIPT_CONTEXT", context),
        ("SLURM_JOB_ID", id),
        ("SLURM_CLUSTER_NAME", "hpc-cluster-west"),
        ("SLURM_JOB_NAME", "gpt-training"),
        ("SLURM_JOB_PARTITION", "gpu"),
        ("SLURM_JOB_NODELIST", "gpu-node-[1-4]"),
    ];
    for (k, val) in extra {
        v.retain(|(kk, _)| kk != k);
        v.push((k, val));
    }
    v
}

/// Asserts that the command of `out` exited 0; otherwise panics with all it printed.
#[track_caller]
pub fn assert_exit_0(out: &Output) {
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{}\nstderr:\n{}",
        stdout(out),
        stderr(out)
    );
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `cvslurm inventory --monitor` (the service) on a site, killed on drop. The site has no
/// Slurm (SlurmBinDir is empty): the service's sender runs and its monitor waits for
/// slurmctld, which is what these tests need.
pub struct Service {
    pub child: Child,
    socket: PathBuf,
}

impl Service {
    pub fn start(site: &Site) -> Service {
        Service::start_with_env(site, &[])
    }

    /// The service with these environment variables too (e.g. `SLURM_CONF`).
    pub fn start_with_env(site: &Site, env: &[(&str, &Path)]) -> Service {
        Service::start_command(site, Command::new(bin()), env)
    }

    /// The service run by `cmd`: the binary itself, or a command that ends by running it
    /// (e.g. [`with_hostname`]); `inventory --monitor` and the site's environment are added.
    pub fn start_command(site: &Site, mut cmd: Command, env: &[(&str, &Path)]) -> Service {
        cmd.args(["inventory", "--monitor"])
            .env_remove("CV_API_TOKEN")
            .env_remove("CV_API_SERVER")
            .env_remove("NOTIFY_SOCKET")
            .env_remove("JOURNAL_STREAM")
            .env("CVSLURM_CONF", &site.conf);
        site.slurm_conf_env(&mut cmd);
        let child = cmd
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut s = Service {
            child,
            socket: site.state_dir.join(layout::WAKE_SOCKET),
        };
        s.wait_live(site);
        s
    }

    /// Waits until the service's wake-up socket answers.
    fn wait_live(&mut self, site: &Site) {
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(sock) = std::os::unix::net::UnixDatagram::unbound() {
                if sock.connect(&self.socket).is_ok() {
                    return;
                }
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!("the service exited ({st}): {}", site.log());
            }
            assert!(
                Instant::now() < until,
                "the service did not listen: {}",
                site.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// kill -9.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Waits (at most `within`) until `ok` holds; panics with `what` otherwise.
pub fn wait_for(what: &str, within: Duration, mut ok: impl FnMut() -> bool) {
    let until = Instant::now() + within;
    while !ok() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A command that runs the binary in a UTS namespace of its own whose host name is
/// `hostname` (`unshare --uts`, as root; else inside a user namespace too): a test can then
/// be a controller whose host name is a full one (`ctl1.example.com`). Arguments go after
/// it as to the binary. `None` where this machine allows neither (the caller says it skips).
pub fn with_hostname(hostname: &str) -> Option<Command> {
    const SET_AND_RUN: &str = "hostname \"$0\" && exec \"$@\"";
    let flags: &[&str] = if nix::unistd::geteuid().is_root() {
        &["--uts"]
    } else {
        &["--user", "--map-root-user", "--uts"]
    };
    let works = Command::new("unshare")
        .args(flags)
        .args(["sh", "-c", SET_AND_RUN, hostname, "true"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !works {
        return None;
    }
    let mut c = Command::new("unshare");
    c.args(flags)
        .args(["sh", "-c", SET_AND_RUN, hostname])
        .arg(bin());
    Some(c)
}

/// Runs `cmd` to its end, killed after `limit`: a test of something that used to hang fails
/// (the returned flag is false) instead of hanging the suite. (finished in time, its output)
pub fn output_within(cmd: &mut Command, limit: Duration) -> (bool, Output) {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => (true, out.unwrap()),
        Err(_) => {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            (false, rx.recv().unwrap().unwrap())
        }
    }
}

/// Puts a copy of `from` at `to` with `mode`, written by a child process (`install`), never
/// through a descriptor of this one: the tests run in parallel in one process, and a child
/// another test forks meanwhile holds this process's descriptors until its exec, so a file
/// this process had open for writing could fail to run with ETXTBSY ("Text file busy").
pub fn install_executable(from: &Path, to: &Path, mode: u32) {
    let out = Command::new("install")
        .arg("-m")
        .arg(format!("{mode:o}"))
        .arg(from)
        .arg(to)
        .output()
        .expect("install runs");
    assert!(
        out.status.success(),
        "install {} {}: {}",
        from.display(),
        to.display(),
        stderr(&out)
    );
}

/// Writes `text` as the executable `to` with `mode`, through [`install_executable`] (the text
/// goes to a file beside it first, removed after).
pub fn write_executable(to: &Path, text: &str, mode: u32) {
    let name = to.file_name().expect("a file name").to_string_lossy();
    let src = to.with_file_name(format!(".{name}.text"));
    fs::write(&src, text).unwrap();
    install_executable(&src, to, mode);
    fs::remove_file(&src).unwrap();
}

/// A small xorshift generator (no dependency for test randomness); seeded from the clock and
/// printed so a failure can be replayed with CVSLURM_SEED.
pub struct Rng(u64);

impl Rng {
    pub fn new() -> Rng {
        let seed = std::env::var("CVSLURM_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
                    | 1
            });
        eprintln!("seed {seed} (CVSLURM_SEED={seed} replays it)");
        Rng(seed)
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// The end of job number `i` of a stress test, in turn: (`SLURM_JOB_EXIT_CODE2`, the state
/// CloudVision must store).
pub fn final_state(i: usize) -> (&'static str, &'static str) {
    match i % 3 {
        0 => ("0:0", "JOB_STATE_COMPLETED"),
        1 => ("2:0", "JOB_STATE_FAILED"),
        _ => ("0:9", "JOB_STATE_FAILED"),
    }
}
