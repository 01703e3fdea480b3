//! `--archive FILE.tar`: the build-ID cache entries of the DSOs in the output's table,
//! laid out as `perf archive` lays them out (paths relative to the cache directory:
//! each `.build-id/xx/rest` link and the `PATH/ID/` directory it names), so that
//! `tar xf FILE.tar -C ~/.debug` on another machine lets `perf report` symbolise.
//! Written as a GNU tar (ustar headers; GNU long-name records for long paths).

use crate::error::{Error, Result};
use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::Path;

/// What went into the archive.
#[derive(Clone, Debug, Default)]
pub(crate) struct ArchiveSummary {
    /// Entries (DSOs) archived.
    pub entries: usize,
    /// Bytes of file content.
    pub bytes: u64,
}

/// Writes the archive of the cache `entries` (directories relative to `cache_dir`,
/// as the report lists them) to `out` (temp file and rename).
pub(crate) fn write<'a>(
    entries: impl IntoIterator<Item = &'a str>,
    cache_dir: &Path,
    out: &Path,
) -> Result<ArchiveSummary> {
    let mut entries: Vec<&str> = entries.into_iter().collect();
    entries.sort_unstable();
    entries.dedup();
    // The outputs' temp file: removed on error and on every signal, a FIFO or
    // device OUT refused.
    let tmp = crate::write::TempOutput::create(out, false)?;
    let r = (|| -> std::io::Result<ArchiveSummary> {
        let f = std::fs::OpenOptions::new().write(true).open(&tmp.path)?;
        let mut w = BufWriter::with_capacity(1 << 20, f);
        let mut sum = ArchiveSummary::default();
        for rel in entries {
            let Some(hex) = Path::new(rel).file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            if hex.len() < 3 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                continue;
            }
            let dir = cache_dir.join(rel);
            let Ok(list) = std::fs::read_dir(&dir) else {
                continue;
            };
            let link = format!(".build-id/{}/{}", &hex[..2], &hex[2..]);
            header(&mut w, &link, b'2', 0o777, 0, &format!("../../{rel}"))?;
            header(&mut w, &format!("{rel}/"), b'5', 0o755, 0, "")?;
            let mut names: Vec<String> = list
                .filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().to_str().map(String::from))
                .filter(|n| !n.starts_with('.'))
                .collect();
            names.sort();
            for n in names {
                let p = dir.join(&n);
                let Ok(mut f) = File::open(&p) else { continue };
                let meta = f.metadata()?;
                if !meta.is_file() {
                    continue;
                }
                use std::os::unix::fs::PermissionsExt;
                let len = meta.len();
                header(
                    &mut w,
                    &format!("{rel}/{n}"),
                    b'0',
                    meta.permissions().mode() & 0o7777,
                    len,
                    "",
                )?;
                let copied = std::io::copy(&mut (&mut f).take(len), &mut w)?;
                if copied != len {
                    return Err(std::io::Error::other(format!(
                        "{} shrank while being archived",
                        p.display()
                    )));
                }
                pad(&mut w, len)?;
                sum.bytes += len;
            }
            sum.entries += 1;
        }
        // Two zero blocks end a tar.
        w.write_all(&[0u8; 1024])?;
        let f = w.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
        Ok(sum)
    })();
    let sum = r.map_err(|source| Error::Output {
        path: out.to_path_buf(),
        source,
    })?;
    tmp.commit()?;
    Ok(sum)
}

fn pad(w: &mut impl Write, len: u64) -> std::io::Result<()> {
    let rem = (len % 512) as usize;
    if rem != 0 {
        w.write_all(&[0u8; 512][..512 - rem])?;
    }
    Ok(())
}

fn octal(field: &mut [u8], v: u64) {
    let s = format!("{v:0width$o}", width = field.len() - 1);
    let b = s.as_bytes();
    let n = b.len().min(field.len() - 1);
    field[..n].copy_from_slice(&b[b.len() - n..]);
    field[field.len() - 1] = 0;
}

/// One header; a name or link target over 100 bytes goes first in a GNU long-name
/// (`L`) or long-link (`K`) record.
fn header(
    w: &mut impl Write,
    name: &str,
    kind: u8,
    mode: u32,
    size: u64,
    link: &str,
) -> std::io::Result<()> {
    if name.len() > 99 {
        long(w, b'L', name)?;
    }
    if link.len() > 99 {
        long(w, b'K', link)?;
    }
    raw_header(w, name.as_bytes(), kind, mode, size, link.as_bytes())
}

fn long(w: &mut impl Write, kind: u8, value: &str) -> std::io::Result<()> {
    let mut data = value.as_bytes().to_vec();
    data.push(0);
    raw_header(w, b"././@LongLink", kind, 0o644, data.len() as u64, b"")?;
    w.write_all(&data)?;
    pad(w, data.len() as u64)
}

fn raw_header(
    w: &mut impl Write,
    name: &[u8],
    kind: u8,
    mode: u32,
    size: u64,
    link: &[u8],
) -> std::io::Result<()> {
    let mut h = [0u8; 512];
    let n = name.len().min(100);
    h[..n].copy_from_slice(&name[..n]);
    octal(&mut h[100..108], mode as u64);
    octal(&mut h[108..116], 0);
    octal(&mut h[116..124], 0);
    octal(&mut h[124..136], size);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    octal(&mut h[136..148], now);
    h[156] = kind;
    let l = link.len().min(100);
    h[157..157 + l].copy_from_slice(&link[..l]);
    // GNU magic: "ustar  \0".
    h[257..265].copy_from_slice(b"ustar  \0");
    h[265..269].copy_from_slice(b"root");
    h[297..301].copy_from_slice(b"root");
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|&b| b as u32).sum();
    let s = format!("{sum:06o}\0 ");
    h[148..156].copy_from_slice(s.as_bytes());
    w.write_all(&h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_checksum() {
        let mut v = Vec::new();
        header(&mut v, "a/b", b'0', 0o644, 5, "").unwrap();
        assert_eq!(v.len(), 512);
        let mut h = v.clone();
        h[148..156].copy_from_slice(b"        ");
        let sum: u32 = h.iter().map(|&b| b as u32).sum();
        let stored = u32::from_str_radix(std::str::from_utf8(&v[148..154]).unwrap(), 8).unwrap();
        assert_eq!(sum, stored);
        let mut v = Vec::new();
        header(&mut v, &"x/".repeat(80), b'5', 0o755, 0, "").unwrap();
        assert_eq!(v.len(), 512 * 3);
    }
}
