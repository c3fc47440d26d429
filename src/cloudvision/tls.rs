//! TLS trust for the CloudVision client: which server certificates are accepted, and a
//! message that says exactly what is wrong with one that is not.
//!
//! A server is accepted when, in this order:
//! - `ApiServerPin` is set: the server's public key (SHA-256 of its SubjectPublicKeyInfo,
//!   `sha256//<base64>`, the form curl's `--pinnedpubkey` uses) must be one of the pins. A
//!   matching key is trusted without a CA; a key that does not match is refused even when a CA
//!   signed it.
//! - otherwise its chain verifies against the trusted roots (system bundle and/or `CaFile`), or
//! - its own certificate is, byte for byte, one of the certificates in `CaFile`: what an
//!   on-prem CloudVision appliance ships is a self-signed certificate (often with `CA:TRUE`,
//!   which the WebPKI rules refuse as a server certificate), and the admin trusts exactly it.
//!
//! Whatever the reason for trust, the certificate must be valid now and be issued for the name
//! (or IP address) in `ApiServer`, and the server must prove it holds the key (the handshake
//! signature is always verified).

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore};
use std::fmt;
use std::io::{Read, Write};
use std::sync::Arc;
use ureq::unversioned::transport::{
    Buffers, ConnectionDetails, Connector, Either, LazyBuffers, NextTimeout, Transport,
    TransportAdapter,
};

/// What the client trusts.
#[derive(Debug, Clone, Default)]
pub struct TrustSpec {
    /// CA certificates whose chains are trusted (DER).
    pub roots: Vec<CertificateDer<'static>>,
    /// Server certificates trusted as they are (DER), from `CaFile`.
    pub exact: Vec<CertificateDer<'static>>,
    /// SHA-256 digests of trusted server public keys (`ApiServerPin`).
    pub pins: Vec<[u8; 32]>,
    /// Turn verification off altogether (`Insecure=yes`).
    pub insecure: bool,
    /// No system bundle and no `CaFile`: use the Mozilla roots built into the binary.
    pub builtin_roots: bool,
}

/// A certificate problem, as the admin should read it.
#[derive(Debug)]
pub struct CertProblem(pub String);

impl fmt::Display for CertProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CertProblem {}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The verifier behind [`TrustSpec`].
#[derive(Debug)]
struct Verifier {
    chain: Option<Arc<WebPkiServerVerifier>>,
    exact: Vec<CertificateDer<'static>>,
    pins: Vec<[u8; 32]>,
    insecure: bool,
    algs: WebPkiSupportedAlgorithms,
}

fn problem(msg: String) -> rustls::Error {
    rustls::Error::InvalidCertificate(CertificateError::Other(rustls::OtherError(Arc::new(
        CertProblem(msg),
    ))))
}

impl Verifier {
    /// Name and validity of a certificate trusted without a chain (pinned or exact).
    fn check_alone(
        &self,
        end_entity: &CertificateDer<'_>,
        server_name: &ServerName<'_>,
        now: UnixTime,
    ) -> Result<(), rustls::Error> {
        let info = CertInfo::parse(end_entity)
            .ok_or_else(|| problem("the server's certificate cannot be parsed".into()))?;
        let t = now.as_secs();
        if t < info.not_before {
            return Err(problem(format!(
                "the server's certificate is not valid before {}",
                crate::timefmt::format_epoch(info.not_before as i64).unwrap_or_default()
            )));
        }
        if t > info.not_after {
            return Err(problem(format!(
                "the server's certificate expired on {}",
                crate::timefmt::format_epoch(info.not_after as i64).unwrap_or_default()
            )));
        }
        let parsed = rustls::server::ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_name(&parsed, server_name)
    }
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if self.insecure {
            return Ok(ServerCertVerified::assertion());
        }
        if !self.pins.is_empty() {
            let pin = CertInfo::parse(end_entity).map(|i| sha256(i.spki));
            return match pin {
                Some(p) if self.pins.contains(&p) => self
                    .check_alone(end_entity, server_name, now)
                    .map(|()| ServerCertVerified::assertion()),
                Some(p) => Err(problem(format!(
                    "the server's key {} is not the one ApiServerPin names (a different server, or its key was replaced)",
                    pin_string(&p)
                ))),
                None => Err(problem("the server's certificate cannot be parsed".into())),
            };
        }
        let chain = match &self.chain {
            Some(v) => {
                v.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
            }
            None => Err(rustls::Error::InvalidCertificate(
                CertificateError::UnknownIssuer,
            )),
        };
        match chain {
            Ok(v) => Ok(v),
            Err(e) if self.exact.iter().any(|c| c.as_ref() == end_entity.as_ref()) => {
                log::debug!("server certificate is the one in CaFile ({e}); checking it alone");
                self.check_alone(end_entity, server_name, now)
                    .map(|()| ServerCertVerified::assertion())
            }
            Err(rustls::Error::InvalidCertificate(c))
                if matches!(c, CertificateError::UnknownIssuer)
                    || format!("{c:?}").contains("CaUsedAsEndEntity") =>
            {
                let pin = CertInfo::parse(end_entity)
                    .map(|i| pin_string(&sha256(i.spki)))
                    .unwrap_or_default();
                Err(problem(format!(
                    "the server's certificate is not signed by a CA in CaFile or the system bundle \
                     (self-signed?); to trust exactly this server, put its certificate in CaFile \
                     or set ApiServerPin={pin}"
                )))
            }
            Err(e) => Err(e),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        if self.insecure {
            return Ok(HandshakeSignatureValid::assertion());
        }
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algs)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        if self.insecure {
            return Ok(HandshakeSignatureValid::assertion());
        }
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algs)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algs.supported_schemes()
    }
}

/// The rustls client configuration for `spec`.
pub fn client_config(spec: &TrustSpec) -> Arc<ClientConfig> {
    let provider = provider();
    let chain = if spec.roots.is_empty() && !spec.builtin_roots {
        None
    } else {
        let mut store = RootCertStore::empty();
        store.add_parsable_certificates(spec.roots.iter().cloned());
        if spec.builtin_roots {
            store.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        }
        WebPkiServerVerifier::builder_with_provider(Arc::new(store), provider.clone())
            .build()
            .ok()
    };
    let verifier = Verifier {
        chain,
        exact: spec.exact.clone(),
        pins: spec.pins.clone(),
        insecure: spec.insecure,
        algs: provider.signature_verification_algorithms,
    };
    let config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(rustls::ALL_VERSIONS)
        .expect("all TLS versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    Arc::new(config)
}

/// Turns a TLS failure into the sentence an admin needs.
pub fn describe(e: &rustls::Error) -> String {
    use CertificateError as C;
    match e {
        rustls::Error::InvalidCertificate(c) => match c {
            C::Other(o) => o.to_string(),
            C::Expired | C::ExpiredContext { .. } => "the server's certificate has expired".into(),
            C::NotValidYet | C::NotValidYetContext { .. } => {
                "the server's certificate is not valid yet (check the clocks)".into()
            }
            C::NotValidForName => {
                "the server's certificate is not issued for this host name".into()
            }
            C::NotValidForNameContext {
                expected,
                presented,
            } => format!(
                "the server's certificate is for {} but ApiServer says {}",
                if presented.is_empty() {
                    "no name".into()
                } else {
                    presented.join(", ")
                },
                expected.to_str()
            ),
            C::UnknownIssuer => "the server's certificate is not signed by a trusted CA".into(),
            C::BadSignature => "the server's certificate does not verify against the trusted CA of its issuer's name (bad signature): is CaFile the CA that signed it?".into(),
            other => format!("the server's certificate is refused: {other:?}"),
        },
        other => format!("TLS failed: {other}"),
    }
}

/// Wraps the TCP transport in TLS with [`client_config`]; ureq's own connector cannot take a
/// custom verifier.
#[derive(Debug)]
pub struct TlsConnector {
    config: Arc<ClientConfig>,
}

impl TlsConnector {
    /// A connector using `config`.
    pub fn new(config: Arc<ClientConfig>) -> TlsConnector {
        TlsConnector { config }
    }
}

impl<In: Transport> Connector<In> for TlsConnector {
    type Out = Either<In, TlsTransport>;

    fn connect(
        &self,
        details: &ConnectionDetails,
        chained: Option<In>,
    ) -> Result<Option<Self::Out>, ureq::Error> {
        let Some(transport) = chained else {
            return Ok(None);
        };
        if !details.needs_tls() || transport.is_tls() {
            return Ok(Some(Either::A(transport)));
        }
        let host = details
            .uri
            .authority()
            .map(|a| a.host().trim_start_matches('[').trim_end_matches(']'))
            .unwrap_or("");
        let name = ServerName::try_from(host.to_string())
            .map_err(|_| ureq::Error::Tls("the server name is not a valid DNS name or IP"))?;
        let mut conn = rustls::ClientConnection::new(self.config.clone(), name)?;
        let mut sock = TransportAdapter::new(transport.boxed(), details.current_time.clone());
        sock.set_timeout(details.timeout);
        conn.complete_io(&mut sock).map_err(|e| {
            match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
                Some(r) => ureq::Error::Rustls(r.clone()),
                None => ureq::Error::from(e),
            }
        })?;
        let buffers = LazyBuffers::new(
            details.config.input_buffer_size(),
            details.config.output_buffer_size(),
        );
        Ok(Some(Either::B(TlsTransport {
            buffers,
            stream: rustls::StreamOwned { conn, sock },
        })))
    }
}

/// A TLS connection for ureq.
pub struct TlsTransport {
    buffers: LazyBuffers,
    stream: rustls::StreamOwned<rustls::ClientConnection, TransportAdapter>,
}

impl fmt::Debug for TlsTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TlsTransport")
    }
}

impl Transport for TlsTransport {
    fn buffers(&mut self) -> &mut dyn Buffers {
        &mut self.buffers
    }

    fn transmit_output(&mut self, amount: usize, timeout: NextTimeout) -> Result<(), ureq::Error> {
        self.stream.get_mut().set_timeout(timeout);
        let output = &self.buffers.output()[..amount];
        self.stream.write_all(output)?;
        Ok(())
    }

    fn await_input(&mut self, timeout: NextTimeout) -> Result<bool, ureq::Error> {
        self.stream.get_mut().set_timeout(timeout);
        let input = self.buffers.input_append_buf();
        let amount = self.stream.read(input)?;
        self.buffers.input_appended(amount);
        Ok(amount > 0)
    }

    fn is_open(&mut self) -> bool {
        self.stream.get_mut().get_mut().is_open()
    }

    fn is_tls(&self) -> bool {
        true
    }
}

/// SHA-256 of `data`.
pub fn sha256(data: &[u8]) -> [u8; 32] {
    let suite = rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256;
    let hash = suite.tls13().expect("TLS 1.3 suite").common.hash_provider;
    let out = hash.hash(data);
    let mut d = [0u8; 32];
    d.copy_from_slice(out.as_ref());
    d
}

/// `sha256//<base64>` of a key digest.
pub fn pin_string(d: &[u8; 32]) -> String {
    format!("sha256//{}", base64(d))
}

/// Parses `sha256//<base64 of 32 bytes>`.
pub fn parse_pin(s: &str) -> Result<[u8; 32], String> {
    let b = s.trim().strip_prefix("sha256//").ok_or_else(|| {
        format!(
            "{s:?} is not sha256//<base64> (see `cvslurm check`, which prints the server's pin)"
        )
    })?;
    let bytes =
        unbase64(b).ok_or_else(|| format!("{s:?}: the part after sha256// is not base64"))?;
    bytes
        .try_into()
        .map_err(|_| format!("{s:?}: a SHA-256 pin is 32 bytes (44 base64 characters)"))
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn base64(data: &[u8]) -> String {
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(B64[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn unbase64(s: &str) -> Option<Vec<u8>> {
    let s = s.trim_end_matches('=');
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.bytes() {
        let v = B64.iter().position(|&x| x == c)? as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    Some(out)
}

/// The parts of an X.509 certificate this module reads.
struct CertInfo<'a> {
    not_before: u64,
    not_after: u64,
    spki: &'a [u8],
}

/// One DER element: (tag, contents, whole element, rest).
type Der<'a> = (u8, &'a [u8], &'a [u8], &'a [u8]);

fn der(input: &[u8]) -> Option<Der<'_>> {
    let tag = *input.first()?;
    let first = *input.get(1)?;
    let (len, hdr) = if first < 0x80 {
        (first as usize, 2)
    } else {
        let n = (first & 0x7f) as usize;
        if n == 0 || n > 4 {
            return None;
        }
        let mut l = 0usize;
        for i in 0..n {
            l = (l << 8) | *input.get(2 + i)? as usize;
        }
        (l, 2 + n)
    };
    let end = hdr.checked_add(len)?;
    if end > input.len() {
        return None;
    }
    Some((tag, &input[hdr..end], &input[..end], &input[end..]))
}

impl<'a> CertInfo<'a> {
    fn parse(cert: &'a [u8]) -> Option<CertInfo<'a>> {
        let (_, c, _, _) = der(cert)?;
        let (_, tbs, _, _) = der(c)?;
        let mut rest = tbs;
        let (tag, _, _, r) = der(rest)?;
        if tag == 0xa0 {
            rest = r; // explicit version
        }
        let (_, _, _, r) = der(rest)?; // serial
        let (_, _, _, r) = der(r)?; // signature algorithm
        let (_, _, _, r) = der(r)?; // issuer
        let (_, validity, _, r) = der(r)?;
        let (_, _, _, r) = der(r)?; // subject
        let (_, _, spki, _) = der(r)?;
        let (t1, nb, _, vr) = der(validity)?;
        let (t2, na, _, _) = der(vr)?;
        Some(CertInfo {
            not_before: asn1_time(t1, nb)?,
            not_after: asn1_time(t2, na)?,
            spki,
        })
    }
}

/// UTCTime (0x17) or GeneralizedTime (0x18), `Z` form, as epoch seconds.
fn asn1_time(tag: u8, b: &[u8]) -> Option<u64> {
    let s = std::str::from_utf8(b).ok()?.strip_suffix('Z')?;
    let (year, rest) = match tag {
        0x17 => {
            let y: i32 = s.get(..2)?.parse().ok()?;
            (if y >= 50 { 1900 + y } else { 2000 + y }, s.get(2..)?)
        }
        0x18 => (s.get(..4)?.parse().ok()?, s.get(4..)?),
        _ => return None,
    };
    let n = |i: usize| -> Option<u8> { rest.get(i..i + 2)?.parse().ok() };
    let date =
        time::Date::from_calendar_date(year, time::Month::try_from(n(0)?).ok()?, n(2)?).ok()?;
    let t = time::Time::from_hms(n(4)?, n(6)?, n(8)?).ok()?;
    let ts = time::PrimitiveDateTime::new(date, t)
        .assume_utc()
        .unix_timestamp();
    u64::try_from(ts).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trip_and_pins() {
        assert_eq!(base64(b"hello"), "aGVsbG8=");
        assert_eq!(unbase64("aGVsbG8=").unwrap(), b"hello");
        let d = sha256(b"abc");
        assert_eq!(
            pin_string(&d),
            "sha256//ungWv48Bz+pBQUDeXa4iI7ADYaOWF3qctBD/YfIAFa0="
        );
        assert_eq!(parse_pin(&pin_string(&d)).unwrap(), d);
        assert!(parse_pin("sha1//abc").unwrap_err().contains("sha256//"));
        assert!(parse_pin("sha256//aGVsbG8=")
            .unwrap_err()
            .contains("32 bytes"));
        assert!(parse_pin("sha256//!!").unwrap_err().contains("not base64"));
    }

    #[test]
    fn asn1_times() {
        assert_eq!(asn1_time(0x17, b"700101000000Z"), Some(0));
        assert_eq!(asn1_time(0x18, b"20260101000000Z"), Some(1_767_225_600));
        assert_eq!(asn1_time(0x17, b"junk"), None);
        assert!(CertInfo::parse(b"\x30\x03\x30\x01").is_none());
    }
}
