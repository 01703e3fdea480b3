//! debuginfod over https (issue 33): Debian's stock `debuginfod`, started here over a
//! folder holding a fixture program, behind a TLS front (`socat OPENSSL-LISTEN` bound
//! to 127.0.0.1) whose certificate a CA made by the test signed (openssl). pdinject,
//! trusting that CA through `SSL_CERT_FILE` or `SSL_CERT_DIR` and given the server
//! by `DEBUGINFOD_URLS`, fetches the missing program byte for byte and writes the same
//! output as through plain http, which perf symbolises the same; another CA, another
//! name and a redirect from https to plain http are refused with the reason.

use super::super::common::*;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A service started by the test, killed when dropped.
struct Service(std::process::Child);

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits up to 30 s for 127.0.0.1:port to take connections.
fn wait_listening(port: u16) -> bool {
    for _ in 0..300 {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

fn openssl(dir: &Path, args: &[&str]) {
    run_ok(Command::new("openssl").args(args).current_dir(dir));
}

/// A CA (`NAME-ca.pem`, `NAME-ca.key`), made with a config of its own so that the
/// system's openssl.cnf does not matter.
fn make_ca(dir: &Path, name: &str) -> PathBuf {
    let cnf = dir.join(format!("{name}-ca.cnf"));
    fs::write(
        &cnf,
        format!(
            "[req]\ndistinguished_name = dn\nx509_extensions = v3_ca\nprompt = no\n\
             [dn]\nCN = pdinject test CA {name}\n\
             [v3_ca]\nbasicConstraints = critical,CA:TRUE\nkeyUsage = critical,keyCertSign,cRLSign\n\
             subjectKeyIdentifier = hash\n"
        ),
    )
    .unwrap();
    let (pem, key) = (format!("{name}-ca.pem"), format!("{name}-ca.key"));
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-config",
            &s(&cnf),
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &pem,
            "-days",
            "2",
        ],
    );
    dir.join(pem)
}

/// The server's certificate for IP 127.0.0.1 (no DNS name), signed by CA `ca`;
/// returns (certificate, key).
fn make_server_cert(dir: &Path, ca: &str) -> (PathBuf, PathBuf) {
    let cnf = dir.join("server.cnf");
    fs::write(
        &cnf,
        "[req]\ndistinguished_name = dn\nprompt = no\n[dn]\nCN = 127.0.0.1\n",
    )
    .unwrap();
    let ext = dir.join("server.ext");
    fs::write(
        &ext,
        "basicConstraints = CA:FALSE\nkeyUsage = critical,digitalSignature\n\
         extendedKeyUsage = serverAuth\nsubjectAltName = IP:127.0.0.1\n\
         authorityKeyIdentifier = keyid\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "req",
            "-new",
            "-config",
            &s(&cnf),
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            &format!("{ca}-ca.pem"),
            "-CAkey",
            &format!("{ca}-ca.key"),
            "-set_serial",
            "2",
            "-days",
            "2",
            "-extfile",
            &s(&ext),
            "-out",
            "server.pem",
        ],
    );
    (dir.join("server.pem"), dir.join("server.key"))
}

/// A TLS front on 127.0.0.1:`port` for 127.0.0.1:`to`. `nodelay` on both sides, as
/// TLS terminators set it: without it, Nagle's algorithm held socat's handshake
/// records back (curl through it: 64-100 ms a request, 8-24 ms with it).
fn tls_front(port: u16, to: u16, cert: &Path, key: &Path) -> Option<Service> {
    let child = Command::new("socat")
        .arg(format!(
            "OPENSSL-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork,nodelay,cert={},key={},verify=0",
            s(cert),
            s(key)
        ))
        .arg(format!("TCP:127.0.0.1:{to},nodelay"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let svc = Service(child);
    wait_listening(port).then_some(svc)
}

/// A server on 127.0.0.1 that sends every request to plain http `to` (same path).
fn redirect_to_plain_http(to: u16) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for c in l.incoming().take(20) {
            let Ok(mut c) = c else { return };
            let mut r = BufReader::new(c.try_clone().unwrap());
            let mut first = String::new();
            let _ = r.read_line(&mut first);
            loop {
                let mut l = String::new();
                if r.read_line(&mut l).unwrap_or(0) == 0 || l == "\r\n" {
                    break;
                }
            }
            let path = first.split_whitespace().nth(1).unwrap_or("/").to_string();
            let _ = write!(
                c,
                "HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:{to}{path}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
        }
    });
    port
}

/// One pdinject run with its own HOME (so its own `~/.debug`) and `env`; returns the
/// report's entry for the program, the run's wall time and the output.
/// A run with `HOME` at `home`, its output and report in `home/out-NAME`.
fn run_in(
    rec: &Path,
    (home, name): (&Path, &str),
    known: &str,
    extra: &[&str],
    env: &[(&str, &Path)],
) -> (serde_json::Value, Duration, PathBuf) {
    let dir = home.join(format!("out-{name}"));
    fs::create_dir_all(&dir).unwrap();
    let out = dir.join("out.data");
    let report = dir.join("report.json");
    let mut c = pdinject();
    c.env("HOME", home)
        .env_remove("DEBUGINFOD_URLS")
        .env_remove("SSL_CERT_FILE")
        .env_remove("SSL_CERT_DIR")
        .env("NO_PROXY", "127.0.0.1,localhost")
        .args(["--known-build-ids", known, "--report", &s(&report)])
        .arg(rec)
        .arg(&out)
        .args(extra);
    for p in ["ALL_PROXY", "HTTPS_PROXY", "HTTP_PROXY"] {
        c.env_remove(p).env_remove(p.to_lowercase());
    }
    for (k, v) in env {
        c.env(k, v);
    }
    let t = Instant::now();
    run_ok(&mut c);
    let took = t.elapsed();
    (read_report(&report), took, out)
}

#[test]
fn debuginfod_over_https_behind_a_tls_front() -> Outcome {
    const TEST: &str = "debuginfod_over_https_behind_a_tls_front";
    for (tool, pkg) in [
        ("debuginfod", "debuginfod"),
        ("socat", "socat"),
        ("openssl", "openssl"),
    ] {
        let ok = Command::new(tool)
            .arg(if tool == "openssl" { "version" } else { "-V" })
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        let ok = ok
            || Command::new(tool)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
        if !ok {
            return skip(format!("{tool} is not installed (apt install {pkg})"));
        }
    }
    let st = setup(TEST)?;
    let rec = record_prog(&st, &["-B"], "rec.data");
    let served = st.dir.join("served");
    fs::create_dir_all(&served).unwrap();
    let prog_bytes = fs::read(&st.fx.prog).unwrap();
    fs::write(served.join("prog"), &prog_bytes).unwrap();
    fs::remove_file(&st.fx.prog).unwrap();
    let known = format!("{PROG_ID} {}", s(&st.fx.prog));

    // The stock server, over plain http on its port.
    let http_port = free_port();
    let Ok(child) = Command::new("debuginfod")
        .args(["-p", &http_port.to_string(), "-d"])
        .arg(st.dir.join("db.sqlite"))
        .arg("-F")
        .arg(&served)
        .env("HOME", test_home())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    else {
        return skip("debuginfod does not start");
    };
    let _debuginfod = Service(child);
    let http = format!("http://127.0.0.1:{http_port}");
    let mut ready = false;
    for _ in 0..300 {
        if debuginfod_serves(&http, PROG_ID) {
            ready = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if !ready {
        return skip("debuginfod did not serve the fixture within 30 s");
    }

    // The TLS front, its CA, and a CA that signed nothing here.
    let pki = st.dir.join("pki");
    fs::create_dir_all(&pki).unwrap();
    let ca = make_ca(&pki, "good");
    let other_ca = make_ca(&pki, "other");
    let (cert, key) = make_server_cert(&pki, "good");
    let tls_port = free_port();
    let Some(_front) = tls_front(tls_port, http_port, &cert, &key) else {
        return skip("socat's TLS front does not start");
    };
    let https = format!("https://127.0.0.1:{tls_port}");
    let ca_dir = st.dir.join("ca-dir");
    fs::create_dir_all(&ca_dir).unwrap();
    fs::copy(&ca, ca_dir.join("good-ca.pem")).unwrap();

    // The three fetching runs share one HOME: a file pdinject links into a cache
    // moves its ctime, and only that cache's link record vouches for it (issue 29),
    // so a second cache would refuse the other DSOs. After each run the program's
    // entry goes, and the next run fetches it again.
    let home = st.dir.join("home");
    let debug = home.join(".debug");
    let forget_prog = || {
        let _ = fs::remove_file(
            debug
                .join(".build-id")
                .join(&PROG_ID[..2])
                .join(&PROG_ID[2..]),
        );
        let _ = fs::remove_dir_all(debug.join(s(&st.fx.prog).trim_start_matches('/')));
    };
    let script = |out: &Path| {
        let o = run_ok(
            st.perf
                .cmd()
                .env("HOME", &home)
                .args(["script", "-F", "ip,sym,dso", "-i"])
                .arg(out),
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    // A run that fetches the program: its output, its time, perf script on it.
    let fetch_run = |what: &str, extra: &[&str], env: &[(&str, &Path)]| {
        let (r, took, out) = run_in(&rec, (&home, what), &known, extra, env);
        let d = report_dso(&r, &s(&st.fx.prog)).unwrap();
        assert_eq!(d["cached"], "fetched", "{what}: {}", report_summary(&r));
        let entry = d["cache_entry"].as_str().unwrap();
        let elf = debug.join(entry).join("elf");
        assert!(
            fs::read(&elf).unwrap() == prog_bytes,
            "{what}: {} is not the served file byte for byte",
            elf.display()
        );
        let symbols = script(&out);
        forget_prog();
        (fs::read(&out).unwrap(), took, symbols)
    };

    // Through TLS: the server from DEBUGINFOD_URLS (a bare --debuginfod), the CA from
    // SSL_CERT_FILE; then from SSL_CERT_DIR.
    let urls = PathBuf::from(&https);
    let (out_https, t_https, sym_https) = fetch_run(
        "https",
        &["--debuginfod"],
        &[("DEBUGINFOD_URLS", &urls), ("SSL_CERT_FILE", &ca)],
    );
    let (out_dir, _, _) = fetch_run(
        "https-dir",
        &["--debuginfod"],
        &[("DEBUGINFOD_URLS", &urls), ("SSL_CERT_DIR", &ca_dir)],
    );
    // The same through plain http: the same output, the same symbols in perf.
    let (out_http, t_http, sym_http) = fetch_run("http", &["--debuginfod", &http], &[]);
    for (what, out) in [("SSL_CERT_DIR", &out_dir), ("http", &out_http)] {
        let at = out_https.iter().zip(out).position(|(x, y)| x != y);
        assert!(
            &out_https == out,
            "the outputs of the https and {what} runs differ: {} and {} bytes, first at {at:?}",
            out_https.len(),
            out.len()
        );
    }
    assert!(
        sym_https.contains("prog_spin"),
        "perf script, https:\n{sym_https}"
    );
    assert_eq!(sym_https, sym_http, "perf script: https against http");
    // What TLS costs: the cache stage of `pdinject -v` (where the fetch happens), with
    // the program fetched through the TLS front, straight from debuginfod over http,
    // or not fetched; in the HOME above, whose cache holds the other DSOs already
    // (the program's entry is removed after each run), the kinds taking
    // turns (so that a load on the machine meets each alike), medians of 9.
    let cache_ms = |home: &Path, extra: &[&str], env: &[(&str, &Path)]| -> f64 {
        let mut c = pdinject();
        c.env("HOME", home)
            .env_remove("SSL_CERT_FILE")
            .env_remove("SSL_CERT_DIR")
            .args(["-v", "--known-build-ids", &known])
            .arg(&rec)
            .arg(home.join("out-timed.data"))
            .args(extra);
        for p in ["ALL_PROXY", "HTTPS_PROXY", "HTTP_PROXY"] {
            c.env_remove(p).env_remove(p.to_lowercase());
        }
        for (k, v) in env {
            c.env(k, v);
        }
        let o = run_ok(&mut c);
        let err = String::from_utf8_lossy(&o.stderr);
        let ms = err
            .split("cache ")
            .nth(1)
            .and_then(|r| r.split(" ms").next())
            .and_then(|n| n.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no cache stage time in -v's output:\n{err}"));
        let fetched = if extra.is_empty() {
            "0 fetched"
        } else {
            "1 fetched"
        };
        assert!(err.contains(fetched), "not {fetched}:\n{err}");
        // Away with the program's entry, so the next run fetches it again.
        forget_prog();
        ms
    };
    // (name, flags, variables)
    type Kind<'a> = (&'a str, Vec<&'a str>, Vec<(&'a str, &'a Path)>);
    let kinds: [Kind; 3] = [
        (
            "https",
            vec!["--debuginfod", &https],
            vec![("SSL_CERT_FILE", &ca)],
        ),
        ("http", vec!["--debuginfod", &http], vec![]),
        ("none", vec![], vec![]),
    ];
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); kinds.len()];
    for round in 0..10 {
        for (k, (_, extra, env)) in kinds.iter().enumerate() {
            let ms = cache_ms(&home, extra, env);
            // The first round fills the cache with the other DSOs: not counted.
            if round > 0 {
                times[k].push(ms);
            }
        }
    }
    let medians: Vec<f64> = times
        .iter_mut()
        .map(|t| {
            t.sort_by(f64::total_cmp);
            t[t.len() / 2]
        })
        .collect();
    eprintln!(
        "{TEST}: cache stage of pdinject -v fetching prog ({} bytes), median of 9: \
         https {:.1} ms, http {:.1} ms, no fetch {:.1} ms (whole first runs: https {:.1} ms, \
         http {:.1} ms)",
        prog_bytes.len(),
        medians[0],
        medians[1],
        medians[2],
        t_https.as_secs_f64() * 1e3,
        t_http.as_secs_f64() * 1e3
    );

    // Refused, each with its reason in the report (the run itself succeeds: a DSO
    // not cached is no error).
    let refused = |home: &str, url: &str, ca: &Path, want: &str| {
        let h = st.dir.join(home);
        let (r, _, _) = run_in(
            &rec,
            (&h, "refused"),
            &known,
            &["--debuginfod", url],
            &[("SSL_CERT_FILE", ca)],
        );
        let d = report_dso(&r, &s(&st.fx.prog)).unwrap();
        assert_eq!(d["cached"], "not-cached", "{home}: {}", report_summary(&r));
        let why = d["cache_detail"].as_str().unwrap_or("");
        assert!(
            why.contains(want),
            "{home}: the reason lacks {want:?}: {why}"
        );
        assert!(
            !h.join(".debug/.build-id").join(&PROG_ID[..2]).exists(),
            "{home}: an entry was made"
        );
        eprintln!("{TEST}: {home}: {why}");
    };
    // A certificate no trusted CA signed.
    refused(
        "home-other-ca",
        &https,
        &other_ca,
        "TLS: invalid peer certificate: UnknownIssuer",
    );
    // A name the certificate does not carry (it is for IP 127.0.0.1 only).
    refused(
        "home-other-name",
        &format!("https://localhost:{tls_port}"),
        &ca,
        "TLS: invalid peer certificate",
    );
    // https that sends the client on to plain http.
    let redirector = redirect_to_plain_http(http_port);
    let down_port = free_port();
    let Some(_down) = tls_front(down_port, redirector, &cert, &key) else {
        return skip("socat's second TLS front does not start");
    };
    refused(
        "home-downgrade",
        &format!("https://127.0.0.1:{down_port}"),
        &ca,
        "redirected from https to plain http",
    );
    Ok(())
}
