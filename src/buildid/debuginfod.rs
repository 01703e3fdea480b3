//! Fetching an executable by build ID from debuginfod servers
//! (`GET /buildid/HEX/executable`), for DSOs whose ID is known (build-ID MMAP2
//! records, the input's table, `--known-build-ids`) but whose file is not on this
//! machine. Plain HTTP/1.1 over std's TcpStream: the servers a fleet runs for itself
//! are usually plain http, and a TLS stack would double the build time; an https
//! URL is refused with that reason.

use crate::format::buildid::BuildId;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// Largest executable accepted (a runaway server must not fill the disk).
const MAX_BYTES: u64 = 4 << 30;
const TIMEOUT: Duration = Duration::from_secs(30);

/// The server list, as perf chooses it: `--debuginfod URLS`; `--debuginfod` alone
/// (or the value `system`) means `DEBUGINFOD_URLS`; without the flag, the
/// `buildid-cache.debuginfod` value of perfconfig; else none (perf clears
/// DEBUGINFOD_URLS for itself unless asked, and so does pdinject: a fetch must be
/// chosen). Lists are space-separated, as elfutils reads them. A value that is no
/// http(s) URL is a usage error.
pub fn urls(flag: Option<&str>) -> Result<Vec<String>, String> {
    let chosen = match flag {
        Some(v) => Some(v.to_string()),
        None => crate::perfconfig::value("buildid-cache", "debuginfod"),
    };
    let v = match chosen.as_deref() {
        None => return Ok(Vec::new()),
        Some("system") => std::env::var("DEBUGINFOD_URLS").unwrap_or_default(),
        Some(v) => v.to_string(),
    };
    let list: Vec<String> = v.split_whitespace().map(String::from).collect();
    if let Some(bad) = list
        .iter()
        .find(|u| !u.starts_with("http://") && !u.starts_with("https://"))
    {
        return Err(format!("--debuginfod: '{bad}' is not an http:// URL"));
    }
    Ok(list)
}

/// Fetches the executable with this ID from the first server that has it, checked
/// to carry exactly this ID.
pub fn fetch(servers: &[String], id: &BuildId) -> Result<Vec<u8>, String> {
    let mut errors = Vec::new();
    for s in servers {
        match fetch_one(s, id) {
            Ok(data) => {
                if super::elf::build_id_of_image(&data).ok() == Some(*id) {
                    return Ok(data);
                }
                errors.push(format!("{s}: the file served has another build ID"));
            }
            Err(e) => errors.push(format!("{s}: {e}")),
        }
    }
    Err(if errors.is_empty() {
        "no server".into()
    } else {
        errors.join("; ")
    })
}

fn fetch_one(server: &str, id: &BuildId) -> Result<Vec<u8>, String> {
    let rest = match server.strip_prefix("http://") {
        Some(r) => r,
        None if server.starts_with("https://") => {
            return Err("https servers are not supported (plain http only)".into());
        }
        None => return Err("not an http:// URL".into()),
    };
    let (hostport, base) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
        None => (rest, ""),
    };
    let addr_str = if hostport.contains(':') && !hostport.ends_with(']') {
        hostport.to_string()
    } else {
        format!("{hostport}:80")
    };
    let addr = addr_str
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {hostport}: {e}"))?
        .next()
        .ok_or_else(|| format!("cannot resolve {hostport}"))?;
    let mut s = TcpStream::connect_timeout(&addr, TIMEOUT).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(TIMEOUT))
        .map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(TIMEOUT))
        .map_err(|e| e.to_string())?;
    write!(
        s,
        "GET {base}/buildid/{id}/executable HTTP/1.1\r\nHost: {hostport}\r\nUser-Agent: pdinject/{}\r\nAccept: */*\r\nConnection: close\r\n\r\n",
        env!("CARGO_PKG_VERSION")
    )
    .map_err(|e| e.to_string())?;
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).map_err(|e| e.to_string())?;
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("not an HTTP response: {:?}", line.trim()))?;
    let (mut len, mut chunked) = (None, false);
    loop {
        line.clear();
        if r.read_line(&mut line).map_err(|e| e.to_string())? == 0 {
            return Err("the response ended in its headers".into());
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            let (k, v) = (k.trim(), v.trim());
            if k.eq_ignore_ascii_case("content-length") {
                len = v.parse::<u64>().ok();
            } else if k.eq_ignore_ascii_case("transfer-encoding") {
                chunked = v.to_ascii_lowercase().contains("chunked");
            }
        }
    }
    if status != 200 {
        return Err(format!("HTTP {status}"));
    }
    let mut body = Vec::new();
    if chunked {
        loop {
            line.clear();
            r.read_line(&mut line).map_err(|e| e.to_string())?;
            let size = u64::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                .map_err(|_| "bad chunk size".to_string())?;
            if size == 0 {
                break;
            }
            if body.len() as u64 + size > MAX_BYTES {
                return Err("the file is too large".into());
            }
            let at = body.len();
            body.resize(at + size as usize, 0);
            r.read_exact(&mut body[at..]).map_err(|e| e.to_string())?;
            line.clear();
            r.read_line(&mut line).map_err(|e| e.to_string())?;
        }
    } else {
        let cap = len.unwrap_or(MAX_BYTES).min(MAX_BYTES);
        r.take(cap + 1)
            .read_to_end(&mut body)
            .map_err(|e| e.to_string())?;
        if body.len() as u64 > cap || len.is_some_and(|l| l != body.len() as u64) {
            return Err("the response has the wrong length".into());
        }
    }
    Ok(body)
}
