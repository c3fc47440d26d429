//! The one CloudVision client: HTTPS with verified TLS, bearer token, JSON bodies, deadlines.
//!
//! Every request of cvslurm goes through [`Client`]. Errors are classified ([`SendError`]) so
//! callers can tell what to retry (unreachable, timeout, 5xx, 429), what needs the admin (token
//! refused) and what CloudVision will never take (other 4xx).

pub(crate) mod batch;
pub mod payload;
pub(crate) mod tls;

use crate::cloudvision::payload::{JobConfig, NodeConfig, NodeKeys};
use crate::cloudvision::tls::{TlsConnector, TrustSpec};
use crate::config::{Config, Token};
use rustls::pki_types::CertificateDer;
use std::fmt;
use std::io::Read;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use ureq::tls::PemItem;
use ureq::unversioned::resolver::{DefaultResolver, ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::{ConnectProxyConnector, Connector, NextTimeout, TcpConnector};

/// Path of JobConfig on the server.
pub const JOB_CONFIG_PATH: &str = "/api/resources/computejob/v1/JobConfig";
/// Path of NodeConfig on the server.
pub const NODE_CONFIG_PATH: &str = "/api/resources/computejob/v1/NodeConfig";
/// The most of a response body that is read (CloudVision's error messages are short).
pub const MAX_RESPONSE_BYTES: u64 = 64 * 1024;
/// The most of a GetOne answer for a NodeConfig that is read: a node's record may be up to
/// `discovery::record::MAX_RECORD_BYTES`, and its NodeConfig about as long.
pub const MAX_NODE_ANSWER_BYTES: u64 = 4 * 1024 * 1024;
/// The most characters of a server's error message that are kept (on one line).
pub const MAX_MESSAGE_CHARS: usize = 300;

/// Where system CA bundles live on Debian/Ubuntu, RHEL-family and SUSE.
const SYSTEM_CA_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// Why a request did not succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendError {
    /// No server is configured (`ApiServer` / `CV_API_SERVER`).
    NotConfigured(String),
    /// DNS, connect, TLS or I/O failure.
    Unreachable(String),
    /// No complete answer within the deadline.
    Timeout(String),
    /// 401 or 403: the token is expired or lacks permission.
    TokenRefused {
        /// HTTP status.
        status: u16,
        /// CloudVision's message.
        message: String,
    },
    /// 429: CloudVision asks to slow down.
    RateLimited {
        /// The `Retry-After` the server gave, if any.
        retry_after: Option<Duration>,
    },
    /// 5xx: a server-side failure, worth retrying.
    Server {
        /// HTTP status.
        status: u16,
        /// CloudVision's message.
        message: String,
    },
    /// The payload is invalid; caught before sending (what CloudVision would answer with 400).
    Invalid(String),
    /// An answer that is not CloudVision's: a 404 without CloudVision's not-found body (the
    /// gRPC-gateway `{"code":5,…}`), or a 2xx whose body is not JSON. A plain web server, a
    /// proxy's error page, or a server without the computejob API: nothing is taken as
    /// "absent" or "delivered" from it, and the request is kept for when ApiServer is right.
    NotCloudVision {
        /// HTTP status.
        status: u16,
        /// The first bytes of the body, on one line.
        excerpt: String,
    },
    /// Any other 4xx: CloudVision will not take this payload as it is.
    Rejected {
        /// HTTP status.
        status: u16,
        /// CloudVision's message.
        message: String,
    },
}

impl SendError {
    /// True when sending the same request later may succeed without anyone changing anything.
    pub fn retryable(&self) -> bool {
        matches!(
            self,
            SendError::Unreachable(_)
                | SendError::Timeout(_)
                | SendError::RateLimited { .. }
                | SendError::Server { .. }
        )
    }
}

impl fmt::Display for SendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SendError::NotConfigured(m) => f.write_str(m),
            SendError::Invalid(m) => write!(f, "invalid JobConfig, not sent: {m}"),
            SendError::Unreachable(m) | SendError::Timeout(m) => f.write_str(m),
            SendError::TokenRefused { status, message } => write!(
                f,
                "CloudVision refused the token (expired or lacking JobConfig/NodeConfig permission): HTTP {status}{}",
                suffix(message)
            ),
            SendError::RateLimited { retry_after } => match retry_after {
                Some(d) => write!(f, "CloudVision is rate limiting (HTTP 429, retry after {} s)", d.as_secs()),
                None => f.write_str("CloudVision is rate limiting (HTTP 429)"),
            },
            SendError::Server { status, message } => {
                write!(f, "CloudVision failed: HTTP {status}{}", suffix(message))
            }
            SendError::Rejected { status, message } => {
                write!(f, "CloudVision rejected the request: HTTP {status}{}", suffix(message))
            }
            SendError::NotCloudVision { status, excerpt } => write!(
                f,
                "the server is not answering as CloudVision: HTTP {status}{}: check that ApiServer names CloudVision (with the computejob API), not a web server or proxy",
                match excerpt.is_empty() {
                    true => " with an empty body".to_string(),
                    false => format!(" {excerpt:?}"),
                }
            ),
        }
    }
}

impl std::error::Error for SendError {}

fn suffix(message: &str) -> String {
    if message.is_empty() {
        String::new()
    } else {
        format!(": {message}")
    }
}

/// How to reach CloudVision.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// `host` or `host:port`.
    pub server: String,
    /// The bearer token; `None` only for dry runs.
    pub token: Option<Token>,
    /// Extra CA certificates (PEM), added to the system roots; a server certificate found in
    /// it is also trusted as it is (a self-signed on-prem CloudVision).
    pub ca_file: Option<PathBuf>,
    /// SHA-256 pins of the server's public key (`ApiServerPin`); when set, only these keys.
    pub pins: Vec<[u8; 32]>,
    /// Turn TLS verification off.
    pub insecure: bool,
    /// Budget of one request when the caller gives no deadline.
    pub timeout: Duration,
}

impl ClientOptions {
    /// Takes the server, CA and TLS settings from the configuration, and the given token.
    /// Refuses (fails closed) while a TLS line of the configuration is bad
    /// ([`Config::tls_refusal`]).
    pub fn from_config(
        cfg: &Config,
        token: Option<Token>,
        timeout: Duration,
    ) -> Result<Self, SendError> {
        if let Some(why) = cfg.tls_refusal() {
            return Err(SendError::NotConfigured(why));
        }
        let server = cfg.api_server.clone().ok_or_else(|| {
            SendError::NotConfigured(
                "no CloudVision server configured: set ApiServer in cloudvision.conf or CV_API_SERVER".into(),
            )
        })?;
        Ok(ClientOptions {
            server,
            token,
            ca_file: cfg.ca_file.clone(),
            pins: cfg.api_server_pins.clone(),
            insecure: cfg.insecure,
            timeout,
        })
    }
}

/// A CloudVision client; cheap to clone and share between threads (connections are pooled).
///
/// Trust: the server must chain to the system CA bundle or to `CaFile`. When a `CaFile` is
/// given, the client first trusts only it (parsing the ~150-certificate system bundle costs
/// more CPU than the whole request); if the server's chain does not verify against it, the client loads system bundle + `CaFile` once, retries the request, and
/// keeps using that set. What is accepted is exactly what system bundle + `CaFile` accepts.
#[derive(Clone)]
pub struct Client {
    agent: ureq::Agent,
    /// Set when `agent` trusts `CaFile` only: the agent trusting system bundle + `CaFile`.
    wide: Option<Arc<WideTrust>>,
    base: String,
    timeout: Duration,
    /// `Bearer <token>`, built once.
    auth: String,
    job_url: String,
    node_url: String,
    /// How node names are written in keys (`QualifyNodeNames`), applied to every record sent.
    node_keys: NodeKeys,
}

/// The system-bundle + `CaFile` agent, built on first need.
struct WideTrust {
    opts: ClientOptions,
    system_bundle: Option<PathBuf>,
    agent: OnceLock<Result<ureq::Agent, SendError>>,
    in_use: AtomicBool,
}

impl WideTrust {
    fn agent(&self) -> Result<&ureq::Agent, SendError> {
        self.agent
            .get_or_init(|| {
                let trust = trust_spec(
                    &self.opts,
                    self.system_bundle.as_deref(),
                    self.opts.ca_file.as_deref(),
                )
                .map_err(SendError::NotConfigured)?;
                Ok(build_agent(&self.opts, &trust))
            })
            .as_ref()
            .map_err(Clone::clone)
    }
}

/// Resolves IP literals without a resolver thread (ureq's default resolver starts one per
/// connection when a timeout is set); host names go to ureq's resolver.
#[derive(Debug, Default)]
struct LiteralFirstResolver(DefaultResolver);

impl Resolver for LiteralFirstResolver {
    fn resolve(
        &self,
        uri: &ureq::http::Uri,
        config: &ureq::config::Config,
        timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        if let (Some(auth), Some("https")) = (uri.authority(), uri.scheme_str()) {
            let host = auth.host().trim_start_matches('[').trim_end_matches(']');
            if let Ok(ip) = host.parse::<IpAddr>() {
                let mut out = self.0.empty();
                out.push(SocketAddr::new(ip, auth.port_u16().unwrap_or(443)));
                return Ok(out);
            }
        }
        self.0.resolve(uri, config, timeout)
    }
}

fn build_agent(opts: &ClientOptions, trust: &TrustSpec) -> ureq::Agent {
    let config = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .user_agent(concat!("cvslurm/", env!("CARGO_PKG_VERSION")))
        .timeout_global(Some(opts.timeout))
        .max_idle_connections(64)
        .max_idle_connections_per_host(64)
        .build();
    let connector = ()
        .chain(ConnectProxyConnector::default())
        .chain(TcpConnector::default())
        .chain(TlsConnector::new(crate::cloudvision::tls::client_config(
            trust,
        )));
    ureq::Agent::with_parts(config, connector, LiteralFirstResolver::default())
}

/// An agent for another HTTP(S) server (`JobCompForward`): trusts the system CA bundle and
/// `ca_file` (its certificates as CAs and as exact server certificates, as for CloudVision);
/// no pin, verification always on; `timeout` per request.
pub fn plain_agent(ca_file: Option<&Path>, timeout: Duration) -> Result<ureq::Agent, String> {
    let opts = ClientOptions {
        server: String::new(),
        token: None,
        ca_file: ca_file.map(Path::to_path_buf),
        pins: Vec::new(),
        insecure: false,
        timeout,
    };
    let trust = trust_spec(&opts, system_bundle().as_deref(), ca_file)?;
    Ok(build_agent(&opts, &trust))
}

/// The first system CA bundle that exists (`SSL_CERT_FILE` first).
fn system_bundle() -> Option<PathBuf> {
    std::env::var_os("SSL_CERT_FILE")
        .map(PathBuf::from)
        .into_iter()
        .chain(SYSTEM_CA_BUNDLES.iter().map(PathBuf::from))
        .find(|p| p.is_file())
}

/// True when TLS failed on the server's certificate chain. With only `CaFile` trusted, a chain
/// to a system root fails as `UnknownIssuer`, or as `BadSignature` when a `CaFile` certificate
/// has the same subject as the real issuer; any certificate failure is retried with the wider
/// set so that exactly what system bundle + `CaFile` accepts is accepted.
fn unknown_issuer(e: &ureq::Error) -> bool {
    matches!(e, ureq::Error::Rustls(rustls::Error::InvalidCertificate(_)))
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

/// What a successful request returned.
#[derive(Debug, Clone)]
pub struct Answer {
    /// HTTP status (2xx).
    pub status: u16,
    /// How long the request took.
    pub elapsed: Duration,
    /// The response body (at most [`MAX_RESPONSE_BYTES`]).
    pub body: String,
}

impl Client {
    /// Builds a client. Fails when the CA file cannot be read or holds no certificate.
    pub fn new(opts: ClientOptions) -> Result<Client, SendError> {
        Client::with_system_bundle(opts, system_bundle())
    }

    /// [`Client::new`] with the system CA bundle at `system_bundle` (`None`: there is none).
    pub fn with_system_bundle(
        opts: ClientOptions,
        system_bundle: Option<PathBuf>,
    ) -> Result<Client, SendError> {
        let (agent, wide) = if opts.insecure {
            let trust = TrustSpec {
                insecure: true,
                ..TrustSpec::default()
            };
            (build_agent(&opts, &trust), None)
        } else if !opts.pins.is_empty() {
            // The pin is the trust: no CA bundle to parse.
            let trust = trust_spec(&opts, None, opts.ca_file.as_deref())
                .map_err(SendError::NotConfigured)?;
            (build_agent(&opts, &trust), None)
        } else if let Some(ca) = opts.ca_file.as_deref() {
            let roots = trust_spec(&opts, None, Some(ca)).map_err(SendError::NotConfigured)?;
            let wide = system_bundle.is_some().then(|| {
                Arc::new(WideTrust {
                    opts: opts.clone(),
                    system_bundle: system_bundle.clone(),
                    agent: OnceLock::new(),
                    in_use: AtomicBool::new(false),
                })
            });
            (build_agent(&opts, &roots), wide)
        } else {
            let roots = trust_spec(&opts, system_bundle.as_deref(), None)
                .map_err(SendError::NotConfigured)?;
            (build_agent(&opts, &roots), None)
        };
        let base = format!("https://{}", opts.server);
        Ok(Client {
            agent,
            wide,
            auth: opts
                .token
                .as_ref()
                .map(|t| format!("Bearer {}", t.expose()))
                .unwrap_or_default(),
            job_url: format!("{base}{JOB_CONFIG_PATH}"),
            node_url: format!("{base}{NODE_CONFIG_PATH}"),
            node_keys: NodeKeys::default(),
            base,
            timeout: opts.timeout,
        })
    }

    /// The server's base URL, `https://host[:port]`.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// The URL of JobConfig.
    pub fn job_url(&self) -> String {
        self.job_url.clone()
    }

    /// The URL of NodeConfig.
    pub fn node_url(&self) -> String {
        self.node_url.clone()
    }

    /// The URL of one NodeConfig (`?key.id=`): what GetOne reads and Delete deletes.
    pub fn node_delete_url(&self, node: &str) -> String {
        format!(
            "{}{NODE_CONFIG_PATH}?key.id={}",
            self.base,
            url_encode(node)
        )
    }

    /// This client, writing node keys as `keys` says (`QualifyNodeNames`).
    pub fn with_node_keys(mut self, keys: NodeKeys) -> Client {
        self.node_keys = keys;
        self
    }

    /// CloudVision's key of `node` of `cluster` as this client writes it.
    pub fn node_key(&self, node: &str, cluster: Option<&str>) -> String {
        self.node_keys.key(node, cluster)
    }

    /// Sends one JobConfig, within `deadline` if given; its node names as
    /// [`Client::with_node_keys`] says.
    pub fn post_job(
        &self,
        job: &JobConfig,
        deadline: Option<Instant>,
    ) -> Result<Answer, SendError> {
        job.validate().map_err(SendError::Invalid)?;
        let job = self.node_keys.job(job);
        let body = serde_json::to_vec(job.as_ref()).expect("JobConfig serializes");
        self.call("POST", &self.job_url, Some(&body), deadline)
    }

    /// Sends one NodeConfig; its key as [`Client::with_node_keys`] says.
    pub fn post_node(
        &self,
        node: &NodeConfig,
        deadline: Option<Instant>,
    ) -> Result<Answer, SendError> {
        let node = self.node_keys.node(node);
        let body = serde_json::to_vec(node.as_ref()).expect("NodeConfig serializes");
        self.call("POST", &self.node_url, Some(&body), deadline)
    }

    /// Asks CloudVision for the NodeConfig whose `key.id` is `id` (GetOne,
    /// `GET …/NodeConfig?key.id=<id>`, as [`Client::get_node`], its answer read up to
    /// [`MAX_NODE_ANSWER_BYTES`]): its stored `value` (lowerCamelCase names), `None` when
    /// CloudVision has none (404). An answer that is not `{"value":{…}}` is a server failure
    /// (worth asking again), never taken as "absent".
    pub fn get_node_value(
        &self,
        id: &str,
        deadline: Option<Instant>,
    ) -> Result<Option<serde_json::Value>, SendError> {
        let url = self.node_key_url(id);
        let a = match self.call_capped("GET", &url, None, deadline, MAX_NODE_ANSWER_BYTES) {
            Err(SendError::Rejected { status: 404, .. }) => return Ok(None),
            other => other?,
        };
        let mut v: serde_json::Value =
            serde_json::from_str(&a.body).map_err(|_| SendError::Server {
                status: a.status,
                message: format!(
                    "NodeConfig {id}: the answer is not JSON: {}",
                    error_message(&a.body)
                ),
            })?;
        match v.get_mut("value").map(serde_json::Value::take) {
            Some(value @ serde_json::Value::Object(_)) => Ok(Some(value)),
            _ => Err(SendError::Server {
                status: a.status,
                message: format!("NodeConfig {id}: the answer holds no \"value\" object"),
            }),
        }
    }

    /// Deletes the NodeConfig whose `key.id` is `id` (as [`Client::node_key`] writes it). A
    /// 404 (already gone) counts as success.
    pub fn delete_node(&self, id: &str, deadline: Option<Instant>) -> Result<Answer, SendError> {
        absent_is_answer(self.call("DELETE", &self.node_delete_url(id), None, deadline))
    }

    /// Proves reachability, TLS and the token with one read that changes nothing: a GetOne of
    /// the JobConfig [`PROBE_KEY`], a key no job has.
    ///
    /// Why a GetOne of a key that cannot exist: in CloudVision's REST mapping a `GET …/JobConfig`
    /// is a GetOne, which needs a fully specified key (a GET without one may be refused with
    /// 400), and GetAll (`…/all`) streams every job. A GetOne of a missing key is answered 404
    /// with CloudVision's not-found body (or 200 with JSON by a lenient server) once the token
    /// is accepted; any other 404, or a 200 that is not JSON, is
    /// [`SendError::NotCloudVision`]: see [`judge_probe`].
    pub fn probe(&self, deadline: Option<Instant>) -> Result<Answer, SendError> {
        judge_probe(self.get_job(PROBE_KEY, deadline))
    }

    /// The URL of one JobConfig (GetOne and Delete take the key as a query parameter).
    pub fn job_key_url(&self, id: &str) -> String {
        format!("{}?key.id={}", self.job_url, url_encode(id))
    }

    /// The URL of one NodeConfig (GetOne).
    pub fn node_key_url(&self, id: &str) -> String {
        self.node_delete_url(id)
    }

    /// GetOne of the JobConfig `id`. A missing key is `Err(Rejected { status: 404, .. })`.
    pub fn get_job(&self, id: &str, deadline: Option<Instant>) -> Result<Answer, SendError> {
        self.call("GET", &self.job_key_url(id), None, deadline)
    }

    /// GetOne of the NodeConfig `id`. A missing key is `Err(Rejected { status: 404, .. })`.
    pub fn get_node(&self, id: &str, deadline: Option<Instant>) -> Result<Answer, SendError> {
        self.call("GET", &self.node_key_url(id), None, deadline)
    }

    /// Sends a JobConfig (`kind` `JobConfig`) or NodeConfig body exactly as given, without
    /// [`JobConfig::validate`]: for `check --contract`, whose questions include requests
    /// cvslurm never makes otherwise (an unknown field, an empty list beside the other one).
    pub fn post_raw(
        &self,
        kind: Kind,
        body: &serde_json::Value,
        deadline: Option<Instant>,
    ) -> Result<Answer, SendError> {
        let url = match kind {
            Kind::Job => &self.job_url,
            Kind::Node => &self.node_url,
        };
        let bytes = serde_json::to_vec(body).expect("JSON serializes");
        self.call("POST", url, Some(&bytes), deadline)
    }

    /// `GET …/JobConfig` without a key (what cvslurm's probe sent before it was a GetOne).
    pub fn get_job_without_key(&self, deadline: Option<Instant>) -> Result<Answer, SendError> {
        self.call("GET", &self.job_url, None, deadline)
    }

    /// Deletes one JobConfig (`DELETE …/JobConfig?key.id=`). Unlike [`Client::delete_node`],
    /// a 404 is returned as the error it is: the caller tells "gone" from "not supported".
    pub fn delete_job(&self, id: &str, deadline: Option<Instant>) -> Result<Answer, SendError> {
        self.call("DELETE", &self.job_key_url(id), None, deadline)
    }

    /// Sends one request and classifies the outcome.
    pub fn call(
        &self,
        method: &str,
        url: &str,
        body: Option<&[u8]>,
        deadline: Option<Instant>,
    ) -> Result<Answer, SendError> {
        self.call_capped(method, url, body, deadline, MAX_RESPONSE_BYTES)
    }

    /// [`Client::call`], reading at most `cap` bytes of the answer.
    fn call_capped(
        &self,
        method: &str,
        url: &str,
        body: Option<&[u8]>,
        deadline: Option<Instant>,
        cap: u64,
    ) -> Result<Answer, SendError> {
        let start = Instant::now();
        let budget = match deadline {
            Some(d) => d.saturating_duration_since(start),
            None => self.timeout,
        };
        let host = self.base.trim_start_matches("https://");
        if budget.is_zero() {
            return Err(SendError::Timeout(format!(
                "no time left to reach CloudVision at {host}"
            )));
        }
        let agent = match &self.wide {
            Some(w) if w.in_use.load(Ordering::Relaxed) => w.agent()?,
            _ => &self.agent,
        };
        let result = match self.send(agent, method, url, body, deadline, budget) {
            Err(e) if unknown_issuer(&e) && !std::ptr::eq(agent, &self.agent) => Err(e),
            Err(e) if unknown_issuer(&e) && self.wide.is_some() => {
                let w = self.wide.as_ref().expect("checked");
                log::debug!("{host}: not signed by CaFile; trying the system CA bundle too");
                let wide = w.agent()?;
                w.in_use.store(true, Ordering::Relaxed);
                let left = match deadline {
                    Some(d) => d.saturating_duration_since(Instant::now()),
                    None => self.timeout.saturating_sub(start.elapsed()),
                };
                self.send(wide, method, url, body, deadline, left)
            }
            other => other,
        };
        let mut resp = result.map_err(|e| match e {
            ureq::Error::Timeout(_) => SendError::Timeout(format!(
                "CloudVision at {host} did not answer within {:.1} s",
                budget.as_secs_f64()
            )),
            ureq::Error::Rustls(r) => SendError::Unreachable(format!(
                "cannot reach CloudVision at {host}: TLS: {}",
                crate::cloudvision::tls::describe(&r)
            )),
            other => SendError::Unreachable(format!("cannot reach CloudVision at {host}: {other}")),
        })?;
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let mut text = String::new();
        let _ = resp
            .body_mut()
            .as_reader()
            .take(cap)
            .read_to_string(&mut text);
        let elapsed = start.elapsed();
        if (200..300).contains(&status) {
            // CloudVision answers JSON (a Set echoes the record, a GetOne holds `value`): a
            // page of HTML is a web server that takes anything.
            if !text.trim().is_empty() && !is_json_object(&text) {
                return Err(not_cloudvision(status, &text));
            }
            return Ok(Answer {
                status,
                elapsed,
                body: text,
            });
        }
        // "Absent" is CloudVision's not-found error, never any 404.
        if status == 404 && !is_not_found_body(&text) {
            return Err(not_cloudvision(status, &text));
        }
        let message = error_message(&text);
        Err(match status {
            401 | 403 => SendError::TokenRefused { status, message },
            429 => SendError::RateLimited { retry_after },
            // A redirect (cvslurm follows none: the token must not go elsewhere) or a request
            // timeout says nothing against the payload: keep it and retry.
            300..=399 => SendError::Server {
                status,
                message: match resp.headers().get("location").and_then(|v| v.to_str().ok()) {
                    Some(l) => format!(
                        "redirected to {}; cvslurm follows no redirect: set ApiServer to the server that answers",
                        l.chars().take(200).collect::<String>()
                    ),
                    None => "a redirect; cvslurm follows none: set ApiServer to the server that answers".into(),
                },
            },
            408 | 500..=599 => SendError::Server { status, message },
            _ => SendError::Rejected { status, message },
        })
    }
}

impl Client {
    /// One request on `agent`. Without a caller deadline the agent's own timeout applies, so
    /// no request-level config is made (ureq then caches the TLS config in the agent instead
    /// of rebuilding it, root store included, for every new connection).
    fn send(
        &self,
        agent: &ureq::Agent,
        method: &str,
        url: &str,
        body: Option<&[u8]>,
        deadline: Option<Instant>,
        budget: Duration,
    ) -> Result<ureq::http::Response<ureq::Body>, ureq::Error> {
        let own_timeout = deadline.is_none() && budget == self.timeout;
        let auth = self.auth.as_str();
        // DELETE and GET carry no body: one path for both.
        let bodyless = |r: ureq::RequestBuilder<ureq::typestate::WithoutBody>| {
            let r = if own_timeout {
                r
            } else {
                r.config().timeout_global(Some(budget)).build()
            };
            r.header("Authorization", auth)
                .header("Accept", "application/json")
                .call()
        };
        match method {
            "POST" => {
                let r = agent.post(url);
                let r = if own_timeout {
                    r
                } else {
                    r.config().timeout_global(Some(budget)).build()
                };
                r.header("Authorization", auth)
                    .header("Content-Type", "application/json")
                    .header("Accept", "application/json")
                    .send(body.unwrap_or(b"{}"))
            }
            "DELETE" => bodyless(agent.delete(url)),
            _ => bodyless(agent.get(url)),
        }
    }
}

/// The two resources of `arista.computejob.v1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// JobConfig.
    Job,
    /// NodeConfig.
    Node,
}

/// The JobConfig key the probe reads: no Slurm job id looks like it (those are
/// `<number>@<cluster>`), and nothing of cvslurm ever writes it.
pub const PROBE_KEY: &str = "cvslurm-probe-key-that-no-job-has";

/// What a probe's GetOne says: 200 with JSON, or CloudVision's not-found answer (the key does
/// not exist, as intended), mean CloudVision is reachable and took the token; 401/403 stay
/// [`SendError::TokenRefused`]; an answer that is not CloudVision's (a plain 404, a page of
/// HTML) stays [`SendError::NotCloudVision`]; anything else stays the error it is, with its
/// status and the server's message.
pub fn judge_probe(r: Result<Answer, SendError>) -> Result<Answer, SendError> {
    absent_is_answer(r)
}

/// CloudVision's not-found answer (the key does not exist) as an answer, not an error: what a
/// probe of a key no job has, and a delete of something already gone, both expect. Only
/// CloudVision's 404 gets here as `Rejected { status: 404 }`: any other is
/// [`SendError::NotCloudVision`].
fn absent_is_answer(r: Result<Answer, SendError>) -> Result<Answer, SendError> {
    match r {
        Err(SendError::Rejected {
            status: 404,
            message,
        }) => Ok(Answer {
            status: 404,
            elapsed: Duration::ZERO,
            body: message,
        }),
        other => other,
    }
}

/// The most characters of a body that is not CloudVision's that an error quotes.
const MAX_EXCERPT_CHARS: usize = 120;

fn not_cloudvision(status: u16, body: &str) -> SendError {
    SendError::NotCloudVision {
        status,
        excerpt: crate::text::one_line(body.trim(), MAX_EXCERPT_CHARS),
    }
}

/// True when `body` is one JSON object.
fn is_json_object(body: &str) -> bool {
    matches!(
        serde_json::from_str::<serde_json::Value>(body),
        Ok(serde_json::Value::Object(_))
    )
}

/// True for CloudVision's not-found answer: the gRPC-gateway error body with code 5
/// (`NOT_FOUND`), `{"code":5,"message":…}`.
pub fn is_not_found_body(body: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("code").and_then(serde_json::Value::as_i64))
        == Some(5)
}

/// Picks CloudVision's `message` out of a JSON error body, else a short excerpt of the text.
fn error_message(body: &str) -> String {
    let json = serde_json::from_str::<serde_json::Value>(body).ok();
    let message = json.as_ref().and_then(|v| {
        v.get("message")
            .or_else(|| v.get("error"))
            .and_then(|m| m.as_str())
    });
    // The server's (or a proxy's) words are stored and shown: one line, capped, no escape
    // sequences.
    crate::text::one_line(message.unwrap_or(body), MAX_MESSAGE_CHARS)
}

/// What to trust: the certificates of the system bundle `system` plus `ca_file` as roots,
/// `ca_file`'s certificates also as exact server certificates, and the key pins.
fn trust_spec(
    opts: &ClientOptions,
    system: Option<&Path>,
    ca_file: Option<&Path>,
) -> Result<TrustSpec, String> {
    let mut spec = TrustSpec {
        pins: opts.pins.clone(),
        ..TrustSpec::default()
    };
    if let Some(p) = system {
        if let Ok(pem) = std::fs::read(p) {
            spec.roots.extend(pem_certs(&pem));
        }
    }
    if let Some(p) = ca_file {
        let pem =
            std::fs::read(p).map_err(|e| format!("cannot read CaFile {}: {e}", p.display()))?;
        let extra: Vec<_> = pem_certs(&pem).collect();
        if extra.is_empty() {
            return Err(format!("CaFile {} holds no PEM certificate", p.display()));
        }
        spec.roots.extend(extra.iter().cloned());
        spec.exact = extra;
    }
    spec.builtin_roots = spec.roots.is_empty() && spec.pins.is_empty();
    Ok(spec)
}

fn pem_certs(pem: &[u8]) -> impl Iterator<Item = CertificateDer<'static>> + '_ {
    ureq::tls::parse_pem(pem).filter_map(|item| match item {
        Ok(PemItem::Certificate(c)) => Some(CertificateDer::from(c.der().to_vec())),
        _ => None,
    })
}

/// Percent-encodes a query value (everything but unreserved characters).
pub fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_judgement() {
        let ok = |status| {
            Ok(Answer {
                status,
                elapsed: Duration::ZERO,
                body: String::new(),
            })
        };
        let rejected = |status: u16| SendError::Rejected {
            status,
            message: "m".into(),
        };
        // 200 and 404 (the key does not exist): reachable, token accepted.
        assert_eq!(judge_probe(ok(200)).map(|a| a.status), Ok(200));
        assert_eq!(judge_probe(Err(rejected(404))).map(|a| a.status), Ok(404));
        // 401/403: the token.
        let refused = SendError::TokenRefused {
            status: 403,
            message: "denied".into(),
        };
        assert_eq!(
            judge_probe(Err(refused.clone())).unwrap_err(),
            refused.clone()
        );
        assert!(refused.to_string().contains("refused the token"));
        // Anything else: named with its status and message.
        let e = judge_probe(Err(rejected(400))).unwrap_err();
        assert_eq!(
            e.to_string(),
            "CloudVision rejected the request: HTTP 400: m"
        );
        // A plain web server's 404 or page: named, never "answers".
        let web = SendError::NotCloudVision {
            status: 404,
            excerpt: "<html>Not Found</html>".into(),
        };
        let e = judge_probe(Err(web)).unwrap_err().to_string();
        assert!(
            e.starts_with(
                "the server is not answering as CloudVision: HTTP 404 \"<html>Not Found</html>\""
            ),
            "{e}"
        );
        assert!(is_not_found_body(r#"{"code":5,"message":"not found"}"#));
        assert!(!is_not_found_body(
            r#"{"errors":["GET not supported by CV stub"]}"#
        ));
        assert!(!is_not_found_body("<html>404</html>"));
        assert!(!is_not_found_body(r#"{"code":"5"}"#));
        let e = judge_probe(Err(SendError::Server {
            status: 502,
            message: "bad gateway".into(),
        }))
        .unwrap_err();
        assert_eq!(e.to_string(), "CloudVision failed: HTTP 502: bad gateway");
    }

    #[test]
    fn encodes_query_values() {
        assert_eq!(url_encode("gpu-node-1"), "gpu-node-1");
        assert_eq!(url_encode("a b&c=d/é"), "a%20b%26c%3Dd%2F%C3%A9");
    }

    /// CaFile-first trust: a server whose chain reaches only the "system" bundle is still
    /// accepted (after the retry with system bundle + CaFile), one reaching neither is not.
    #[test]
    fn falls_back_to_system_roots() {
        use std::process::{Command, Stdio};
        let root = std::env::temp_dir().join(format!("cvslurm-ut-roots-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let (a, b) = (root.join("a"), root.join("b"));
        let standin = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/standin/cv_standin.py");
        let gen = Command::new("python3")
            .args([standin, "--dir", b.to_str().unwrap(), "--gen-certs-only"])
            .status();
        if !gen.is_ok_and(|s| s.success()) {
            eprintln!("skipped: python3 or openssl missing");
            return;
        }
        let mut server = Command::new("python3")
            .args([standin, "--dir", a.to_str().unwrap(), "--port", "0"])
            .args(["--token", "t"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let until = Instant::now() + Duration::from_secs(20);
        let port = loop {
            if let Some(p) = std::fs::read_to_string(a.join("port"))
                .ok()
                .and_then(|s| s.trim().parse::<u16>().ok())
            {
                break p;
            }
            assert!(Instant::now() < until, "stand-in did not start");
            std::thread::sleep(Duration::from_millis(20));
        };
        let client = |system: &Path| {
            Client::with_system_bundle(
                ClientOptions {
                    server: format!("127.0.0.1:{port}"),
                    token: Token::new("t"),
                    ca_file: Some(b.join("ca.pem")), // not the server's CA
                    pins: Vec::new(),
                    insecure: false,
                    timeout: Duration::from_secs(10),
                },
                Some(system.to_path_buf()),
            )
            .unwrap()
        };
        let good = client(&a.join("ca.pem")).probe(None);
        let bad = client(&b.join("ca.pem")).probe(None);
        let _ = server.kill();
        let _ = server.wait();
        let _ = std::fs::remove_dir_all(&root);
        assert_eq!(good.map(|a| a.status).map_err(|e| e.to_string()), Ok(404));
        let bad = bad.unwrap_err().to_string();
        assert!(
            bad.contains("TLS: the server's certificate does not verify"),
            "{bad}"
        );
    }

    #[test]
    fn error_messages() {
        assert_eq!(
            error_message(r#"{"code":16,"message":"bad token"}"#),
            "bad token"
        );
        assert_eq!(
            error_message("<html>\n oops </html>"),
            "<html> oops </html>"
        );
        // A hostile message: one line, escapes visible, capped.
        let evil = format!(
            r#"{{"message":"\u001b[2J\u001b[1A\rFAKE OK\n{}"}}"#,
            "x".repeat(5000)
        );
        let m = error_message(&evil);
        assert!(m.starts_with("\\x1b[2J\\x1b[1A FAKE OK x"), "{m}");
        assert!(!m.chars().any(char::is_control), "{m}");
        assert_eq!(m.chars().count(), MAX_MESSAGE_CHARS);
        let e = SendError::TokenRefused {
            status: 401,
            message: "bad token".into(),
        };
        assert_eq!(
            e.to_string(),
            "CloudVision refused the token (expired or lacking JobConfig/NodeConfig permission): HTTP 401: bad token"
        );
        assert!(!e.retryable());
        assert!(SendError::Server {
            status: 503,
            message: String::new()
        }
        .retryable());
        assert!(!SendError::Rejected {
            status: 400,
            message: String::new()
        }
        .retryable());
    }
}
