//! The tracing data (HEADER_TRACING_DATA: the feature section of a file, the bytes
//! after the record in a stream) without the kernel's addresses. Its `kallsyms` part
//! (a copy of /proc/kallsyms perf may put there) and its `printk` part (the addresses
//! of the kernel's printk format strings, `0xffffffff828179e4 : "thaw_processes"`)
//! give the KASLR slide away in plain text; perf 7.3's `--aslr` copies them (119
//! kernel addresses in a sched_switch recording's output). Both are written empty:
//! perf reads an empty part as "none recorded". The event formats, which the reader
//! needs to decode tracepoint events, and the saved command lines stay.
//!
//! The layout, as perf's `trace-event-info.c` writes it and `trace-event-read.c`
//! reads it (numbers in the byte order its own header names):
//! magic `\x17\x08\x44tracing`, a version string, a big-endian byte, the size of a
//! long, the page size (u32); `header_page` and `header_event` (a name, a u64 size,
//! the bytes); the ftrace formats (a u32 count of u64-sized files); the event systems
//! (a u32 count of a name and a u32 count of u64-sized files); kallsyms (u32 size);
//! printk (u32 size); from version 0.6 the saved command lines (u64 size).

const MAGIC: &[u8] = b"\x17\x08\x44tracing";

/// `data` with its kallsyms and printk parts emptied; `None` when `data` is not
/// tracing data as perf writes it (the caller then leaves it out whole: what cannot
/// be read cannot be shown to hold no address).
pub(crate) fn without_kernel_addresses(data: &[u8]) -> Option<Vec<u8>> {
    let mut r = Cursor {
        data,
        at: 0,
        big: false,
    };
    r.take(MAGIC.len()).filter(|m| *m == MAGIC)?;
    r.cstr()?;
    r.big = r.byte()? != 0;
    r.byte()?; // the size of a long
    r.u32()?; // the page size
    for name in [&b"header_page"[..], b"header_event"] {
        (r.cstr()? == name).then_some(())?;
        let n = r.u64()?;
        r.skip(n)?;
    }
    // ftrace's own formats, then each system's.
    r.files()?;
    for _ in 0..r.u32()? {
        r.cstr()?;
        r.files()?;
    }
    let kallsyms_at = r.at;
    let n = r.u32()?;
    r.skip(u64::from(n))?;
    let n = r.u32()?;
    r.skip(u64::from(n))?;
    let rest = &data[r.at..];
    let mut out = Vec::with_capacity(kallsyms_at + 8 + rest.len());
    out.extend_from_slice(&data[..kallsyms_at]);
    let zero = 0u32.to_ne_bytes();
    out.extend_from_slice(&zero);
    out.extend_from_slice(&zero);
    out.extend_from_slice(rest);
    Some(out)
}

struct Cursor<'a> {
    data: &'a [u8],
    at: usize,
    big: bool,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.data.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }

    fn skip(&mut self, n: u64) -> Option<()> {
        self.take(usize::try_from(n).ok()?).map(|_| ())
    }

    fn byte(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    fn cstr(&mut self) -> Option<&'a [u8]> {
        let rest = self.data.get(self.at..)?;
        let n = rest.iter().position(|&b| b == 0)?;
        self.at += n + 1;
        Some(&rest[..n])
    }

    fn u32(&mut self) -> Option<u32> {
        let b: [u8; 4] = self.take(4)?.try_into().ok()?;
        Some(if self.big {
            u32::from_be_bytes(b)
        } else {
            u32::from_le_bytes(b)
        })
    }

    fn u64(&mut self) -> Option<u64> {
        let b: [u8; 8] = self.take(8)?.try_into().ok()?;
        Some(if self.big {
            u64::from_be_bytes(b)
        } else {
            u64::from_le_bytes(b)
        })
    }

    /// A u32 count of files, each a u64 size and its bytes.
    fn files(&mut self) -> Option<()> {
        for _ in 0..self.u32()? {
            let n = self.u64()?;
            self.skip(n)?;
        }
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(big: bool, version: &[u8], cmdlines: bool) -> Vec<u8> {
        let u32b = |v: u32| {
            if big {
                v.to_be_bytes()
            } else {
                v.to_le_bytes()
            }
        };
        let u64b = |v: u64| {
            if big {
                v.to_be_bytes()
            } else {
                v.to_le_bytes()
            }
        };
        let mut d = MAGIC.to_vec();
        d.extend_from_slice(version);
        d.push(0);
        d.push(big as u8);
        d.push(8);
        d.extend_from_slice(&u32b(4096));
        for (name, body) in [(&b"header_page"[..], &b"hp"[..]), (b"header_event", b"hev")] {
            d.extend_from_slice(name);
            d.push(0);
            d.extend_from_slice(&u64b(body.len() as u64));
            d.extend_from_slice(body);
        }
        d.extend_from_slice(&u32b(1));
        d.extend_from_slice(&u64b(3));
        d.extend_from_slice(b"fmt");
        d.extend_from_slice(&u32b(1));
        d.extend_from_slice(b"sched\0");
        d.extend_from_slice(&u32b(1));
        d.extend_from_slice(&u64b(6));
        d.extend_from_slice(b"switch");
        let ks = b"ffffffff81000000 T _text\n";
        d.extend_from_slice(&u32b(ks.len() as u32));
        d.extend_from_slice(ks);
        let pk = b"0xffffffff828179e4 : \"thaw\"\n";
        d.extend_from_slice(&u32b(pk.len() as u32));
        d.extend_from_slice(pk);
        if cmdlines {
            d.extend_from_slice(&u64b(7));
            d.extend_from_slice(b"1 bash\n");
        }
        d
    }

    #[test]
    fn kernel_parts_go_and_the_rest_stays_in_either_byte_order() {
        for big in [false, true] {
            let d = sample(big, b"0.6", true);
            let out = without_kernel_addresses(&d).unwrap();
            let text = String::from_utf8_lossy(&out);
            assert!(!text.contains("ffffffff"), "{text}");
            assert!(
                text.contains("switch") && text.ends_with("1 bash\n"),
                "{text}"
            );
            // Read again: it parses, and the parts are empty.
            assert_eq!(without_kernel_addresses(&out).unwrap(), out);
            let cut = d.len() - 7 - 8 - 28 - 4 - 25 - 4;
            assert_eq!(out.len(), cut + 8 + 8 + 7);
        }
        let old = sample(false, b"0.5", false);
        assert!(without_kernel_addresses(&old).unwrap().ends_with(&[0; 8]));
    }

    #[test]
    fn what_is_not_tracing_data_is_refused() {
        let d = sample(false, b"0.6", true);
        assert!(without_kernel_addresses(&d[..40]).is_none());
        assert!(without_kernel_addresses(b"not tracing").is_none());
        let mut bad = d.clone();
        bad[MAGIC.len() + 4 + 2 + 4] = b'x'; // "header_page" misnamed
        assert!(without_kernel_addresses(&bad).is_none());
    }
}
