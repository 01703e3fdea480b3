//! Fetching a file by build ID from debuginfod servers (`GET URL/buildid/HEX/executable`
//! or `/debuginfo`), for DSOs whose ID is known (build-ID MMAP2 records, the input's
//! table, `--known-build-ids`) but whose file is not on this machine.
//!
//! http and https, through ureq with rustls (ring): the servers distributions run
//! (Debian's, Fedora's, Ubuntu's, elfutils' federating one) and a fleet's own behind a
//! load balancer speak https. The CA certificates are the system's, found as OpenSSL's
//! tools find them (`SSL_CERT_FILE`, `SSL_CERT_DIR`, else the distribution's bundle);
//! they are read once per process, at the first fetch.
//!
//! The client follows elfutils' variables (`debuginfod-client-config(7)`), read whether
//! or not the server list came from `DEBUGINFOD_URLS`: `DEBUGINFOD_TIMEOUT` (default 90
//! s; a server must send 100 KiB, or the whole file, within each such span, and no
//! single wait for data may last longer), `DEBUGINFOD_MAXTIME` (the whole download;
//! default none) and `DEBUGINFOD_MAXSIZE` (bytes; sent to the server as
//! `X-DEBUGINFOD-MAXSIZE`, as elfutils does, and enforced here whatever the server
//! says). Whatever they say, no file over [`MAX_BYTES`] is taken, redirects are followed
//! at most [`MAX_REDIRECTS`] times and never from https to plain http, and a file is
//! taken only when its own note carries exactly the ID asked for.

use crate::format::buildid::BuildId;
use std::ffi::OsString;
use std::io::Read;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Largest file accepted whatever `DEBUGINFOD_MAXSIZE` says: a download is held in
/// memory before its ID is checked, and a runaway server must not take it all.
pub(crate) const MAX_BYTES: u64 = 4 << 30;
/// `DEBUGINFOD_TIMEOUT` when unset: elfutils' default.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(90);
/// What a server must send within each `DEBUGINFOD_TIMEOUT` (elfutils: "at least 100K").
pub(crate) const LOW_SPEED_BYTES: u64 = 100 << 10;
/// Redirects followed for one request (a load balancer, a federating server that
/// sends the client on, one more for good measure; a loop ends here).
pub(crate) const MAX_REDIRECTS: u32 = 8;

/// The client's settings, from elfutils' variables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Settings {
    /// `DEBUGINFOD_TIMEOUT`: the span within which a server must send its headers and
    /// 100 KiB (or the whole file), and the longest wait for any one read. `None`
    /// (the value 0 or less): no timeout.
    pub timeout: Option<Duration>,
    /// `DEBUGINFOD_MAXTIME`: the whole download, redirects included. `None` (unset, 0):
    /// no bound but the above.
    pub max_time: Option<Duration>,
    /// `DEBUGINFOD_MAXSIZE`: the largest file asked for. `None` (unset, 0): only
    /// [`MAX_BYTES`].
    pub max_size: Option<u64>,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            timeout: Some(DEFAULT_TIMEOUT),
            max_time: None,
            max_size: None,
        }
    }
}

/// A client variable that holds no whole number.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{var}={value:?} is not a whole number of {unit} (see debuginfod-client-config(7))")]
pub(crate) struct SettingsError {
    /// The variable.
    pub var: &'static str,
    /// Its value.
    pub value: String,
    /// What the number counts.
    pub unit: &'static str,
}

impl Settings {
    /// The settings of this process's environment.
    pub(crate) fn from_env() -> Result<Settings, SettingsError> {
        Settings::from_vars(|k| std::env::var_os(k))
    }

    /// The settings the variables `get` returns say (elfutils: 0 or less, or unset,
    /// means none, but for the timeout, whose default is 90 s).
    pub(crate) fn from_vars(
        get: impl Fn(&str) -> Option<OsString>,
    ) -> Result<Settings, SettingsError> {
        let number =
            |var: &'static str, unit: &'static str| -> Result<Option<i64>, SettingsError> {
                let Some(v) = get(var) else { return Ok(None) };
                let v = v.to_string_lossy().trim().to_string();
                if v.is_empty() {
                    return Ok(None);
                }
                v.parse::<i64>().map(Some).map_err(|_| SettingsError {
                    var,
                    value: v,
                    unit,
                })
            };
        let secs = |n: i64| (n > 0).then(|| Duration::from_secs(n.unsigned_abs()));
        Ok(Settings {
            timeout: match number("DEBUGINFOD_TIMEOUT", "seconds")? {
                None => Some(DEFAULT_TIMEOUT),
                Some(n) => secs(n),
            },
            max_time: number("DEBUGINFOD_MAXTIME", "seconds")?.and_then(secs),
            max_size: number("DEBUGINFOD_MAXSIZE", "bytes")?
                .filter(|n| *n > 0)
                .map(i64::unsigned_abs),
        })
    }

    /// The largest file taken.
    pub(crate) fn limit(&self) -> u64 {
        self.max_size.map_or(MAX_BYTES, |m| m.min(MAX_BYTES))
    }
}

/// The environment's settings, read once (a process's environment does not change
/// under it).
fn env_settings() -> Result<Settings, SettingsError> {
    static S: OnceLock<Result<Settings, SettingsError>> = OnceLock::new();
    S.get_or_init(Settings::from_env).clone()
}

/// The servers a run fetches from (see `urls`). With any, elfutils' client
/// variables are read now, so that a DEBUGINFOD_TIMEOUT that is no number is a usage
/// error before the run, not a failed fetch in the middle of it.
pub fn servers(flag: Option<&str>) -> crate::error::Result<Vec<String>> {
    use crate::error::Error;
    let servers = urls(flag).map_err(|e| Error::Usage(e.to_string()))?;
    if !servers.is_empty() {
        Settings::from_env().map_err(|e| Error::Usage(e.to_string()))?;
    }
    Ok(servers)
}

/// A word of the server list that is not a server.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--debuginfod: '{0}' is not an http:// or https:// URL")]
pub(crate) struct NotAUrl(pub String);

/// The server list, as perf chooses it: `--debuginfod URLS`; `--debuginfod` alone
/// (or the value `system`) means `DEBUGINFOD_URLS`; without the flag, the
/// `buildid-cache.debuginfod` value of perfconfig; else none (perf clears
/// DEBUGINFOD_URLS for itself unless asked, and so does pdinject: a fetch must be
/// chosen). Lists are space-separated, as elfutils reads them. elfutils' IMA policy
/// tags (`ima:enforcing`, `ima:ignore`) are not servers: the URLs after
/// `ima:enforcing` (up to an `ima:ignore`) are left out, since pdinject checks no IMA
/// signature and such a server's files are to be taken only signed. Any other word
/// that is no http(s) URL is a usage error.
pub(crate) fn urls(flag: Option<&str>) -> Result<Vec<String>, NotAUrl> {
    let chosen = match flag {
        Some(v) => Some(v.to_string()),
        None => crate::perfconfig::value("buildid-cache", "debuginfod"),
    };
    let v = match chosen.as_deref() {
        None => return Ok(Vec::new()),
        Some("system") => std::env::var("DEBUGINFOD_URLS").unwrap_or_default(),
        Some(v) => v.to_string(),
    };
    let mut list = Vec::new();
    let mut enforcing = false;
    for w in v.split_whitespace() {
        if let Some(policy) = w.strip_prefix("ima:") {
            enforcing = policy != "ignore";
        } else if !w.starts_with("http://") && !w.starts_with("https://") {
            return Err(NotAUrl(w.to_string()));
        } else if !enforcing {
            list.push(w.to_string());
        }
    }
    Ok(list)
}

/// Why no server gave the file: each server's reason, in the order they were asked.
#[derive(Debug, thiserror::Error)]
#[error("{}", describe(.0))]
pub(crate) struct FetchError(pub Vec<(String, ServerError)>);

fn describe(tried: &[(String, ServerError)]) -> String {
    if tried.is_empty() {
        return "no server".into();
    }
    tried
        .iter()
        .map(|(s, e)| format!("{s}: {e}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Why one server did not give the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum ServerError {
    /// A client variable is not a number.
    #[error(transparent)]
    Settings(#[from] SettingsError),
    /// The URL is neither http:// nor https://.
    #[error("not an http:// or https:// URL")]
    NotHttp,
    /// The server answered with another status than 200 (404: it has no such file).
    #[error("HTTP {0}")]
    Status(u16),
    /// The file is larger than the limit (said by its length, the server's refusal,
    /// or the bytes that came).
    #[error("the file is {} bytes, over the limit of {limit} ({why})", size.map_or("more".into(), |s| s.to_string()))]
    TooLarge {
        /// Its size, when told.
        size: Option<u64>,
        /// The limit.
        limit: u64,
        /// Which limit.
        why: &'static str,
    },
    /// The body's length is not the one its header said.
    #[error("the response has the wrong length: {got} bytes where Content-Length said {said}")]
    WrongLength {
        /// Content-Length.
        said: u64,
        /// Bytes received.
        got: u64,
    },
    /// A server that sends too slowly (elfutils' rule).
    #[error(
        "too slow: {got} bytes in {secs} s, less than 100 KiB (DEBUGINFOD_TIMEOUT={secs})",
        secs = .timeout.as_secs()
    )]
    TooSlow {
        /// Bytes received in the last span.
        got: u64,
        /// The span.
        timeout: Duration,
    },
    /// A wait for the server ran out.
    #[error("{0}")]
    Timeout(String),
    /// More redirects than [`MAX_REDIRECTS`].
    #[error("more than {MAX_REDIRECTS} redirects")]
    TooManyRedirects,
    /// An https server sent the client to plain http.
    #[error("redirected from https to plain http ({0}): refused")]
    Downgrade(String),
    /// The TLS handshake failed: a certificate no CA trusted here signed, one for
    /// another name, an expired one, ...
    #[error("TLS: {0}")]
    Tls(String),
    /// No CA certificate could be read for an https server.
    #[error("no CA certificates to check the server's with: {0}")]
    NoCaCertificates(String),
    /// The host name does not resolve.
    #[error("cannot resolve the host name")]
    HostNotFound,
    /// A network error (connection refused, reset, ...).
    #[error("{0}")]
    Io(std::io::Error),
    /// Anything else the HTTP client said.
    #[error("{0}")]
    Http(String),
    /// The file served carries another build ID (or none).
    #[error("the file served has another build ID")]
    OtherBuildId,
}

impl ServerError {
    /// The reason of a failed request or read, in the terms of the variables.
    fn of_ureq(e: ureq::Error, s: &Settings) -> ServerError {
        use ureq::Timeout as T;
        let secs = |d: Option<Duration>| d.map_or(0, |d| d.as_secs());
        match e {
            ureq::Error::Timeout(T::Global) => ServerError::Timeout(format!(
                "not done within {} s (DEBUGINFOD_MAXTIME)",
                secs(s.max_time)
            )),
            ureq::Error::Timeout(t) => ServerError::Timeout(format!(
                "no answer within {} s ({}; DEBUGINFOD_TIMEOUT)",
                secs(s.timeout),
                match t {
                    T::Resolve => "resolving the host",
                    T::Connect => "connecting",
                    T::SendRequest | T::PerWrite => "sending the request",
                    T::RecvResponse => "waiting for the response",
                    _ => "waiting for data",
                }
            )),
            ureq::Error::TooManyRedirects => ServerError::TooManyRedirects,
            ureq::Error::RequireHttpsOnly(u) => ServerError::Downgrade(u),
            ureq::Error::Rustls(e) => tls(&e),
            ureq::Error::Tls(e) => ServerError::Tls(e.to_string()),
            ureq::Error::HostNotFound => ServerError::HostNotFound,
            // rustls reports a refused certificate as an I/O error of the handshake.
            ureq::Error::Io(e) => match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>())
            {
                Some(t) => tls(t),
                None => ServerError::Io(e),
            },
            e => ServerError::Http(e.to_string()),
        }
    }
}

/// A failed handshake; a certificate of an unknown CA says where trusted ones come from.
fn tls(e: &rustls::Error) -> ServerError {
    use rustls::{CertificateError, Error};
    ServerError::Tls(match e {
        Error::InvalidCertificate(CertificateError::UnknownIssuer) => format!(
            "{e} (the CA certificates trusted are those of SSL_CERT_FILE or SSL_CERT_DIR, else the system's)"
        ),
        e => e.to_string(),
    })
}

/// Fetches the executable with this ID from the first server that has it, checked
/// to carry exactly this ID.
pub(crate) fn fetch(servers: &[String], id: &BuildId) -> Result<Vec<u8>, FetchError> {
    fetch_kind(servers, id, "executable")
}

/// Fetches the debug info with this ID (`/buildid/HEX/debuginfo`: a separate debug
/// file, or an unstripped executable), checked to carry exactly this ID.
pub(crate) fn fetch_debuginfo(servers: &[String], id: &BuildId) -> Result<Vec<u8>, FetchError> {
    fetch_kind(servers, id, "debuginfo")
}

fn fetch_kind(servers: &[String], id: &BuildId, kind: &str) -> Result<Vec<u8>, FetchError> {
    match env_settings() {
        Ok(s) => fetch_with(&s, servers, id, kind),
        Err(e) => Err(FetchError(
            servers
                .iter()
                .map(|u| (u.clone(), ServerError::Settings(e.clone())))
                .collect(),
        )),
    }
}

/// Fetches `/buildid/ID/KIND` (`executable`, `debuginfo`) from the first of `servers`
/// that has it, with these settings; the file must carry exactly this ID.
pub(crate) fn fetch_with(
    settings: &Settings,
    servers: &[String],
    id: &BuildId,
    kind: &str,
) -> Result<Vec<u8>, FetchError> {
    let mut tried = Vec::new();
    for s in servers {
        match fetch_one(settings, s, id, kind) {
            Ok(data) if super::elf::build_id_of_image(&data).ok() == Some(*id) => return Ok(data),
            Ok(_) => tried.push((s.clone(), ServerError::OtherBuildId)),
            Err(e) => tried.push((s.clone(), e)),
        }
    }
    Err(FetchError(tried))
}

/// The system's CA certificates (`SSL_CERT_FILE`, `SSL_CERT_DIR`, else the
/// distribution's bundle, as rustls-native-certs finds them), read once.
fn system_roots() -> Result<Arc<Vec<ureq::tls::Certificate<'static>>>, String> {
    static ROOTS: OnceLock<Result<Arc<Vec<ureq::tls::Certificate<'static>>>, String>> =
        OnceLock::new();
    ROOTS
        .get_or_init(|| {
            let found = rustls_native_certs::load_native_certs();
            if found.certs.is_empty() {
                let why = found
                    .errors
                    .iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join("; ");
                return Err(if why.is_empty() {
                    "none found (install ca-certificates, or set SSL_CERT_FILE)".into()
                } else {
                    why
                });
            }
            Ok(Arc::new(
                found
                    .certs
                    .iter()
                    .map(|c| ureq::tls::Certificate::from_der(c.as_ref()).to_owned())
                    .collect(),
            ))
        })
        .clone()
}

/// The HTTP client for one server. An https server is held to https through its
/// redirects; a plain http one may send the client on to https.
fn agent(s: &Settings, https: bool) -> Result<ureq::Agent, ServerError> {
    use ureq::tls::{RootCerts, TlsConfig, TlsProvider};
    let roots = match system_roots() {
        Ok(r) => r,
        Err(e) if https => return Err(ServerError::NoCaCertificates(e)),
        // Plain http needs none; a redirect to https then fails on the certificate.
        Err(_) => Arc::new(Vec::new()),
    };
    let tls = TlsConfig::builder()
        .provider(TlsProvider::Rustls)
        .root_certs(RootCerts::Specific(roots))
        .unversioned_rustls_crypto_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .build();
    let t = s.timeout;
    Ok(ureq::Agent::config_builder()
        .tls_config(tls)
        .http_status_as_error(false)
        .https_only(https)
        .max_redirects(MAX_REDIRECTS)
        .user_agent(concat!("pdinject/", env!("CARGO_PKG_VERSION")))
        .timeout_resolve(t)
        .timeout_connect(t)
        .timeout_send_request(t)
        .timeout_recv_response(t)
        .timeout_per_read(t)
        .timeout_per_write(t)
        .timeout_global(s.max_time)
        .build()
        .new_agent())
}

fn fetch_one(s: &Settings, server: &str, id: &BuildId, kind: &str) -> Result<Vec<u8>, ServerError> {
    let https = if server.starts_with("https://") {
        true
    } else if server.starts_with("http://") {
        false
    } else {
        return Err(ServerError::NotHttp);
    };
    let url = format!("{}/buildid/{id}/{kind}", server.trim_end_matches('/'));
    let limit = s.limit();
    let why = if s.max_size.is_some_and(|m| m < MAX_BYTES) {
        "DEBUGINFOD_MAXSIZE"
    } else {
        "pdinject's limit"
    };
    let too_large = |size| ServerError::TooLarge { size, limit, why };
    let mut req = ureq::Agent::get(&agent(s, https)?, &url);
    if let Some(m) = s.max_size {
        req = req.header("X-DEBUGINFOD-MAXSIZE", m.to_string());
    }
    // elfutils' span starts with the request: headers and the first 100 KiB within it.
    let start = Instant::now();
    let resp = req.call().map_err(|e| ServerError::of_ureq(e, s))?;
    match resp.status().as_u16() {
        200 => {}
        // debuginfod's answer to X-DEBUGINFOD-MAXSIZE for a larger file.
        406 if s.max_size.is_some() => return Err(too_large(None)),
        code => return Err(ServerError::Status(code)),
    }
    let said = resp.body().content_length();
    if let Some(n) = said.filter(|n| *n > limit) {
        return Err(too_large(Some(n)));
    }
    let mut reader = resp.into_body().into_with_config().reader();
    // Capacity from the header only up to 64 MiB: a lying header costs nothing.
    let mut body = Vec::with_capacity(said.unwrap_or(0).min(64 << 20) as usize);
    let mut buf = vec![0u8; 64 << 10];
    let (mut span_start, mut span_bytes) = (start, 0u64);
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(ServerError::of_ureq(ureq::Error::from(e), s)),
        };
        if body.len() as u64 + n as u64 > limit {
            return Err(too_large(said));
        }
        body.extend_from_slice(&buf[..n]);
        if let Some(t) = s.timeout {
            let now = Instant::now();
            if now.duration_since(span_start) >= t {
                let got = body.len() as u64 - span_bytes;
                if got < LOW_SPEED_BYTES {
                    return Err(ServerError::TooSlow { got, timeout: t });
                }
                (span_start, span_bytes) = (now, body.len() as u64);
            }
        }
    }
    // ureq stops at Content-Length and errs on a body cut short; checked again here, as
    // the bounds above rely on it.
    if let Some(n) = said.filter(|n| *n != body.len() as u64) {
        return Err(ServerError::WrongLength {
            said: n,
            got: body.len() as u64,
        });
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    //! The client against small servers of the tests' own on 127.0.0.1, each answering
    //! as a broken, slow or lying debuginfod would (the real one is tested in
    //! tests/it: cache.rs and store.rs over http, install/https.rs through TLS).

    use super::*;
    use std::io::{BufRead, BufReader, Write};
    use std::net::{TcpListener, TcpStream};
    use std::sync::mpsc;

    /// A small ELF file with a build ID (this machine's `true`), and the ID.
    fn elf() -> (Vec<u8>, BuildId) {
        for p in ["/usr/bin/true", "/bin/true"] {
            if let Ok(d) = std::fs::read(p)
                && let Ok(id) = crate::buildid::elf::build_id_of_image(&d)
            {
                return (d, id);
            }
        }
        let d = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let id = crate::buildid::elf::build_id_of_image(&d).unwrap();
        (d, id)
    }

    /// A server on 127.0.0.1 answering each connection with `answer(request line,
    /// request headers, stream)`; the requests' headers come back on the channel.
    fn serve(
        answer: impl Fn(&str, &mut TcpStream) + Send + 'static,
    ) -> (String, mpsc::Receiver<String>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(mut c) = c else { return };
                let mut r = BufReader::new(c.try_clone().unwrap());
                let mut head = String::new();
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    head.push_str(&line);
                }
                let first = head.lines().next().unwrap_or("").to_string();
                let _ = tx.send(head);
                answer(&first, &mut c);
            }
        });
        (url, rx)
    }

    fn quick() -> Settings {
        Settings {
            timeout: Some(Duration::from_secs(1)),
            ..Settings::default()
        }
    }

    fn one(s: &Settings, url: &str, id: &BuildId) -> Result<Vec<u8>, ServerError> {
        match fetch_with(s, &[url.to_string()], id, "executable") {
            Ok(d) => Ok(d),
            Err(FetchError(mut v)) => Err(v.pop().unwrap().1),
        }
    }

    fn ok_head(len: usize) -> String {
        format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n")
    }

    #[test]
    fn the_file_with_the_id_and_no_other() {
        let (data, id) = elf();
        let d = data.clone();
        let (url, rx) = serve(move |req, c| {
            assert!(req.starts_with("GET /base/buildid/"), "{req}");
            let _ = c.write_all(ok_head(d.len()).as_bytes());
            let _ = c.write_all(&d);
        });
        let base = format!("{url}/base/");
        assert_eq!(one(&quick(), &base, &id).unwrap(), data);
        let head = rx.recv().unwrap();
        assert!(
            head.contains(&format!("/buildid/{id}/executable")),
            "{head}"
        );
        assert!(head.to_ascii_lowercase().contains("user-agent: pdinject/"));
        assert!(!head.to_ascii_lowercase().contains("x-debuginfod-maxsize"));
        // The same file asked for under another ID.
        let other = BuildId::from_hex("00112233445566778899aabbccddeeff00112233").unwrap();
        assert!(matches!(
            one(&quick(), &base, &other),
            Err(ServerError::OtherBuildId)
        ));
    }

    #[test]
    fn chunked_and_a_second_server_after_a_404() {
        let (data, id) = elf();
        let (missing, _) = serve(|_, c| {
            let _ = c.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
        });
        let d = data.clone();
        let (url, _) = serve(move |_, c| {
            let _ = c.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
            for part in d.chunks(1000) {
                let _ = write!(c, "{:x}\r\n", part.len());
                let _ = c.write_all(part);
                let _ = c.write_all(b"\r\n");
            }
            let _ = c.write_all(b"0\r\n\r\n");
        });
        let got = fetch_with(&quick(), &[missing.clone(), url], &id, "executable").unwrap();
        assert_eq!(got, data);
        let e = fetch_with(&quick(), std::slice::from_ref(&missing), &id, "executable");
        let e = e.unwrap_err().to_string();
        assert_eq!(e, format!("{missing}: HTTP 404"));
        assert_eq!(
            fetch_with(&quick(), &[], &id, "executable")
                .unwrap_err()
                .to_string(),
            "no server"
        );
    }

    #[test]
    fn a_length_that_lies_is_refused() {
        let (data, id) = elf();
        // Says more than it sends, then closes.
        let d = data.clone();
        let (url, _) = serve(move |_, c| {
            let _ = c.write_all(ok_head(d.len() + 100).as_bytes());
            let _ = c.write_all(&d);
        });
        let e = one(&quick(), &url, &id).unwrap_err();
        assert!(
            matches!(e, ServerError::Io(_) | ServerError::WrongLength { .. }),
            "{e:?}"
        );
        // Says less than it sends: the bytes past the length are not the file.
        let d = data.clone();
        let (url, _) = serve(move |_, c| {
            let _ = c.write_all(ok_head(d.len() / 2).as_bytes());
            let _ = c.write_all(&d);
        });
        let e = one(&quick(), &url, &id).unwrap_err();
        assert!(matches!(e, ServerError::OtherBuildId), "{e:?}");
    }

    #[test]
    fn maxsize_is_sent_and_held_to() {
        let (data, id) = elf();
        let small = Settings {
            max_size: Some(1000),
            ..quick()
        };
        // Said by the length: refused before the body is read.
        let (url, rx) = serve(|_, c| {
            let _ = c.write_all(ok_head(1 << 30).as_bytes());
        });
        let e = one(&small, &url, &id).unwrap_err();
        assert!(
            matches!(
                e,
                ServerError::TooLarge {
                    size: Some(1073741824),
                    limit: 1000,
                    why: "DEBUGINFOD_MAXSIZE"
                }
            ),
            "{e:?}"
        );
        let head = rx.recv().unwrap().to_ascii_lowercase();
        assert!(head.contains("x-debuginfod-maxsize: 1000"), "{head}");
        // Refused by the server (debuginfod answers 406).
        let (url, _) = serve(|_, c| {
            let _ = c.write_all(b"HTTP/1.1 406 Not Acceptable\r\nContent-Length: 0\r\n\r\n");
        });
        let e = one(&small, &url, &id).unwrap_err();
        assert!(
            matches!(e, ServerError::TooLarge { size: None, .. }),
            "{e:?}"
        );
        // No length: counted as it comes.
        let d = data.clone();
        let (url, _) = serve(move |_, c| {
            let _ = c.write_all(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n");
            let _ = c.write_all(&d);
        });
        let e = one(&small, &url, &id).unwrap_err();
        assert!(matches!(e, ServerError::TooLarge { .. }), "{e:?}");
        assert!(
            e.to_string()
                .contains("over the limit of 1000 (DEBUGINFOD_MAXSIZE)")
        );
        // Without the variable, the same file is taken.
        assert_eq!(one(&quick(), &url, &id).unwrap(), data);
    }

    #[test]
    fn a_slow_server_is_bounded() {
        let (_, id) = elf();
        // Never answers.
        let (url, _) = serve(|_, _| std::thread::sleep(Duration::from_secs(10)));
        let t = Instant::now();
        let e = one(&quick(), &url, &id).unwrap_err();
        assert!(matches!(e, ServerError::Timeout(_)), "{e:?}");
        assert!(e.to_string().contains("DEBUGINFOD_TIMEOUT"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        // Answers, then sends a byte every 50 ms: under 100 KiB a second.
        let (url, _) = serve(|_, c| {
            let _ = c.write_all(ok_head(1 << 20).as_bytes());
            for _ in 0..200 {
                if c.write_all(b"x").is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let t = Instant::now();
        let e = one(&quick(), &url, &id).unwrap_err();
        assert!(matches!(e, ServerError::TooSlow { .. }), "{e:?}");
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        // DEBUGINFOD_MAXTIME bounds the whole download.
        let (url, _) = serve(|_, c| {
            let _ = c.write_all(ok_head(1 << 30).as_bytes());
            let chunk = vec![0u8; 200 << 10];
            for _ in 0..100 {
                if c.write_all(&chunk).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let s = Settings {
            max_time: Some(Duration::from_secs(1)),
            timeout: Some(Duration::from_secs(5)),
            ..Settings::default()
        };
        let t = Instant::now();
        let e = one(&s, &url, &id).unwrap_err();
        assert!(e.to_string().contains("DEBUGINFOD_MAXTIME"), "{e:?}");
        assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    }

    #[test]
    fn redirects_are_followed_within_bounds() {
        let (data, id) = elf();
        let d = data.clone();
        let (url, _) = serve(move |req, c| {
            if req.starts_with("GET /old/") {
                let path = req
                    .split_whitespace()
                    .nth(1)
                    .unwrap()
                    .replacen("/old/", "/new/", 1);
                let _ = write!(
                    c,
                    "HTTP/1.1 302 Found\r\nLocation: {path}\r\nContent-Length: 0\r\n\r\n"
                );
            } else {
                let _ = c.write_all(ok_head(d.len()).as_bytes());
                let _ = c.write_all(&d);
            }
        });
        assert_eq!(one(&quick(), &format!("{url}/old"), &id).unwrap(), data);
        // A loop.
        let (url, _) = serve(|req, c| {
            let path = req.split_whitespace().nth(1).unwrap_or("/").to_string();
            let _ = write!(
                c,
                "HTTP/1.1 302 Found\r\nLocation: {path}\r\nContent-Length: 0\r\n\r\n"
            );
        });
        let e = one(&quick(), &url, &id).unwrap_err();
        assert!(matches!(e, ServerError::TooManyRedirects), "{e:?}");
    }

    #[test]
    fn settings_as_elfutils_reads_them() {
        let of = |vars: &[(&str, &str)]| {
            let vars: Vec<(String, String)> = vars
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            Settings::from_vars(|k| {
                vars.iter()
                    .find(|(n, _)| n == k)
                    .map(|(_, v)| OsString::from(v))
            })
        };
        assert_eq!(of(&[]).unwrap(), Settings::default());
        assert_eq!(Settings::default().timeout, Some(Duration::from_secs(90)));
        let s = of(&[
            ("DEBUGINFOD_TIMEOUT", "5"),
            ("DEBUGINFOD_MAXTIME", "60"),
            ("DEBUGINFOD_MAXSIZE", "1048576"),
        ])
        .unwrap();
        assert_eq!(s.timeout, Some(Duration::from_secs(5)));
        assert_eq!(s.max_time, Some(Duration::from_secs(60)));
        assert_eq!((s.max_size, s.limit()), (Some(1 << 20), 1 << 20));
        let none = of(&[
            ("DEBUGINFOD_TIMEOUT", "0"),
            ("DEBUGINFOD_MAXTIME", "-1"),
            ("DEBUGINFOD_MAXSIZE", "0"),
        ])
        .unwrap();
        assert_eq!(
            (none.timeout, none.max_time, none.max_size),
            (None, None, None)
        );
        assert_eq!(none.limit(), MAX_BYTES);
        let huge = of(&[("DEBUGINFOD_MAXSIZE", "99999999999999")]).unwrap();
        assert_eq!(huge.limit(), MAX_BYTES);
        let e = of(&[("DEBUGINFOD_TIMEOUT", "soon")]).unwrap_err();
        assert_eq!(e.var, "DEBUGINFOD_TIMEOUT");
        assert!(e.to_string().contains("\"soon\""), "{e}");
    }

    #[test]
    fn server_lists() {
        assert_eq!(
            urls(Some(
                "http://a:8002 https://b/ ima:enforcing https://c ima:ignore http://d"
            ))
            .unwrap(),
            ["http://a:8002", "https://b/", "http://d"]
        );
        assert_eq!(
            urls(Some("ftp://x")).unwrap_err().to_string(),
            "--debuginfod: 'ftp://x' is not an http:// or https:// URL"
        );
        assert!(urls(Some("")).unwrap().is_empty());
    }
}
