//! Deferred user callchains (issue 29): `perf record --call-graph fp,defer` (perf 7.x
//! on kernels after 6.18) ends each sample's chain with PERF_CONTEXT_USER_DEFERRED and
//! a cookie; the user part follows in a PERF_RECORD_CALLCHAIN_DEFERRED record (type
//! 22) of the same thread. This machine's kernel cannot record them, so the test
//! builds such a recording the way the kernel writes them from a real frame-pointer
//! recording of `prog`: each sample keeps its kernel part, then the marker and a
//! cookie, and a type-22 record with the user addresses follows (the same pid and
//! tid, the time plus one in its sample-id trailer); the attrs get `defer_callchain` (bit 38) so perf 7.3
//! joins them. perf 7.3's `script` must read it as the original. Only samples whose
//! IP is in libfix.so are kept, so prog (and libc) are reachable only through the
//! deferred user chains: every output form must still give them their IDs.

use super::common::*;
use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::process::Stdio;

const SAMPLE: u32 = 9;
const MMAP2: u32 = 10;
const CALLCHAIN_DEFERRED: u32 = 22;
const CONTEXT_USER: u64 = (-512i64) as u64;
const CONTEXT_USER_DEFERRED: u64 = (-640i64) as u64;

/// perf_event_attr sample_type bits this rewriter knows.
mod st {
    pub const IP: u64 = 1 << 0;
    pub const TID: u64 = 1 << 1;
    pub const TIME: u64 = 1 << 2;
    pub const ADDR: u64 = 1 << 3;
    pub const READ: u64 = 1 << 4;
    pub const CALLCHAIN: u64 = 1 << 5;
    pub const ID: u64 = 1 << 6;
    pub const CPU: u64 = 1 << 7;
    pub const PERIOD: u64 = 1 << 8;
    pub const STREAM_ID: u64 = 1 << 9;
    pub const IDENTIFIER: u64 = 1 << 16;
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

/// The fields of a sample up to its callchain, and where that is.
struct SampleHead {
    ip: u64,
    pidtid: u64,
    time: u64,
    id: u64,
    stream_id: u64,
    cpu: u64,
    identifier: u64,
    /// Offset of the callchain's `nr` in the record.
    chain_at: usize,
}

fn sample_head(r: &[u8], sample_type: u64) -> SampleHead {
    assert_eq!(
        sample_type & st::READ,
        0,
        "PERF_SAMPLE_READ is not handled here"
    );
    assert_ne!(sample_type & st::CALLCHAIN, 0, "no callchains");
    let mut at = 8;
    let mut h = SampleHead {
        ip: 0,
        pidtid: 0,
        time: 0,
        id: 0,
        stream_id: 0,
        cpu: 0,
        identifier: 0,
        chain_at: 0,
    };
    let mut take = |bit: u64, into: &mut u64| {
        if sample_type & bit != 0 {
            *into = le64(r, at);
            at += 8;
        }
    };
    take(st::IDENTIFIER, &mut h.identifier);
    take(st::IP, &mut h.ip);
    take(st::TID, &mut h.pidtid);
    take(st::TIME, &mut h.time);
    let mut addr = 0;
    take(st::ADDR, &mut addr);
    take(st::ID, &mut h.id);
    take(st::STREAM_ID, &mut h.stream_id);
    take(st::CPU, &mut h.cpu);
    let mut period = 0;
    take(st::PERIOD, &mut period);
    h.chain_at = at;
    h
}

/// The sample-id trailer of a kernel record, from a sample's fields.
fn trailer(h: &SampleHead, sample_type: u64, time: u64) -> Vec<u8> {
    let mut t = Vec::new();
    for (bit, v) in [
        (st::TID, h.pidtid),
        (st::TIME, time),
        (st::ID, h.id),
        (st::STREAM_ID, h.stream_id),
        (st::CPU, h.cpu),
        (st::IDENTIFIER, h.identifier),
    ] {
        if sample_type & bit != 0 {
            t.extend_from_slice(&v.to_le_bytes());
        }
    }
    t
}

fn record(kind: u32, misc: u16, body: &[u8]) -> Vec<u8> {
    let mut r = Vec::with_capacity(8 + body.len());
    r.extend_from_slice(&kind.to_le_bytes());
    r.extend_from_slice(&misc.to_le_bytes());
    r.extend_from_slice(&u16::try_from(8 + body.len()).unwrap().to_le_bytes());
    r.extend_from_slice(body);
    r
}

/// The executable ranges of every MMAP2 record of a file whose name ends with
/// `suffix`.
fn exec_ranges(d: &[u8], suffix: &str) -> Vec<(u64, u64)> {
    let (off, size) = (le64(d, 40) as usize, le64(d, 48) as usize);
    let mut at = off;
    let mut v = Vec::new();
    while at < off + size {
        let (kind, len) = (
            le32(d, at),
            u16::from_le_bytes([d[at + 6], d[at + 7]]) as usize,
        );
        if kind == MMAP2 && le32(d, at + 64) & 4 != 0 {
            let name = &d[at + 72..at + len];
            let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
            if name.ends_with(suffix.as_bytes()) {
                let start = le64(d, at + 16);
                v.push((start, start + le64(d, at + 24)));
            }
        }
        at += len;
    }
    v
}

/// `src` (a little-endian perf.data file of one attr layout with callchains) with
/// only the samples whose IP is in `keep`, written twice: as recorded (`plain`) and
/// with each sample's user chain moved into a CALLCHAIN_DEFERRED record after it
/// (`deferred`). Returns how many user chains were deferred.
fn rewrite(src: &Path, keep: &[(u64, u64)], plain: &Path, deferred: &Path) -> usize {
    let d = fs::read(src).unwrap();
    let attr_size = le64(&d, 16) as usize;
    let (attrs_off, attrs_len) = (le64(&d, 24) as usize, le64(&d, 32) as usize);
    let sample_type = le64(&d, attrs_off + 24);
    for a in (attrs_off..attrs_off + attrs_len).step_by(attr_size) {
        assert_eq!(le64(&d, a + 24), sample_type, "one sample layout");
        assert_ne!(le64(&d, a + 40) & (1 << 18), 0, "sample_id_all");
    }
    let (off, size) = (le64(&d, 40) as usize, le64(&d, 48) as usize);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let mut at = off;
    let mut cookie = 0u64;
    while at < off + size {
        let (kind, len) = (
            le32(&d, at),
            u16::from_le_bytes([d[at + 6], d[at + 7]]) as usize,
        );
        let r = &d[at..at + len];
        at += len;
        if kind != SAMPLE {
            a.extend_from_slice(r);
            b.extend_from_slice(r);
            continue;
        }
        let h = sample_head(r, sample_type);
        if !keep.iter().any(|&(s, e)| s <= h.ip && h.ip < e) {
            continue;
        }
        a.extend_from_slice(r);
        let nr = le64(r, h.chain_at) as usize;
        let ips: Vec<u64> = (0..nr).map(|i| le64(r, h.chain_at + 8 + 8 * i)).collect();
        let end = h.chain_at + 8 + 8 * nr;
        let Some(u) = ips.iter().position(|&x| x == CONTEXT_USER) else {
            b.extend_from_slice(r);
            continue;
        };
        cookie += 1;
        let mut chain: Vec<u64> = ips[..u].to_vec();
        chain.extend([CONTEXT_USER_DEFERRED, cookie]);
        let mut body = r[8..h.chain_at].to_vec();
        body.extend_from_slice(&(chain.len() as u64).to_le_bytes());
        for x in &chain {
            body.extend_from_slice(&x.to_le_bytes());
        }
        body.extend_from_slice(&r[end..]);
        b.extend_from_slice(&record(SAMPLE, u16::from_le_bytes([r[4], r[5]]), &body));
        // The user part, as the kernel writes it when the task returns to user space.
        let user = &ips[u + 1..];
        let mut body = Vec::new();
        body.extend_from_slice(&cookie.to_le_bytes());
        body.extend_from_slice(&(user.len() as u64).to_le_bytes());
        for x in user {
            body.extend_from_slice(&x.to_le_bytes());
        }
        body.extend(trailer(&h, sample_type, h.time + 1));
        b.extend_from_slice(&record(CALLCHAIN_DEFERRED, 2, &body));
    }
    for (data, out, defer) in [(&a, plain, false), (&b, deferred, true)] {
        let mut o = d[..off].to_vec();
        if defer {
            // perf_event_attr.defer_callchain (flags bit 38): perf 7.3 waits for the
            // user part only then.
            for a in (attrs_off..attrs_off + attrs_len).step_by(attr_size) {
                let f = le64(&o, a + 40) | 1 << 38;
                o[a + 40..a + 48].copy_from_slice(&f.to_le_bytes());
            }
        }
        o.extend_from_slice(data);
        let table_at = o.len();
        o.extend_from_slice(&d[off + size..]);
        o[48..56].copy_from_slice(&(data.len() as u64).to_le_bytes());
        let delta = data.len() as i64 - size as i64;
        let nfeat: u32 = (0..4).map(|i| le64(&d, 72 + 8 * i).count_ones()).sum();
        for i in 0..nfeat as usize {
            let p = table_at + 16 * i;
            let v = (le64(&o, p) as i64 + delta) as u64;
            o[p..p + 8].copy_from_slice(&v.to_le_bytes());
        }
        fs::write(out, o).unwrap();
    }
    cookie as usize
}

/// The type-22 records of a perf.data file's data section, in order.
fn deferred_records(file: &Path) -> Vec<Vec<u8>> {
    let d = fs::read(file).unwrap();
    let (off, size) = (le64(&d, 40) as usize, le64(&d, 48) as usize);
    let mut at = off;
    let mut v = Vec::new();
    while at < off + size {
        let (kind, len) = (
            le32(&d, at),
            u16::from_le_bytes([d[at + 6], d[at + 7]]) as usize,
        );
        if kind == CALLCHAIN_DEFERRED {
            v.push(d[at..at + len].to_vec());
        }
        at += len;
    }
    v
}

/// prog, libfix.so and libc carry their IDs in `ids` (what perf reads of an output).
fn assert_ids(st: &Setup, ids: &BTreeMap<String, String>, ctx: &str) {
    let mut want = vec![(s(&st.fx.prog), PROG_ID.to_string())];
    want.push((s(&st.fx.libfix), LIB_ID.to_string()));
    if let Some(libc) = libc_path()
        && let Some(id) = elf_build_id(Path::new(&libc))
    {
        want.push((libc, id));
    }
    for (path, id) in want {
        assert_eq!(
            ids.get(&path).map(String::as_str),
            Some(id.as_str()),
            "{ctx}: {path}:\n{}",
            fmt_map(ids)
        );
    }
}

#[test]
fn deferred_user_callchains_mark_their_dsos_in_every_form() -> Outcome {
    const T: &str = "deferred_user_callchains_mark_their_dsos_in_every_form";
    let st = setup(T)?;
    let p73 = perf73()?;
    let rec = record_prog(&st, &["-B", "-g"], "fp.data");
    let keep = exec_ranges(&fs::read(&rec).unwrap(), "/libfix.so");
    assert!(!keep.is_empty(), "no MMAP2 record of libfix.so");
    let plain = st.dir.join("plain.data");
    let defer = st.dir.join("defer.data");
    let n = rewrite(&rec, &keep, &plain, &defer);
    assert!(n > 10, "only {n} samples in libfix.so");

    // perf 7.3 reads the deferred file as the original: the same symbols per
    // sample, chains included.
    let args = ["-F", "comm,tid,time,ip,sym,dso"];
    let a = perf_script(&p73, &plain, &args);
    let b = perf_script(&p73, &defer, &args);
    assert!(
        a.contains("(") && a.lines().count() > n,
        "{}",
        tail(a.as_bytes())
    );
    assert!(
        a == b,
        "perf 7.3 reads the deferred file otherwise:\n{}",
        first_diff(&a, &b)
    );
    // prog is in the chains only (its main and _start), never a sample's IP.
    let ips = perf_script(&p73, &plain, &["-F", "ip,dso", "--hide-call-graph"]);
    assert!(!ips.contains(&format!("({})", s(&st.fx.prog))), "{ips}");
    assert!(
        a.contains(&format!("({})", s(&st.fx.prog))),
        "prog in no chain"
    );

    let mut ctx_ids: Vec<(String, BTreeMap<String, String>)> = Vec::new();
    // File outputs: the table, both build-ID MMAP2 forms, --convert-callchain.
    for (form, flags) in [
        ("table", &[][..]),
        ("mmap2", &["--mmap2-buildids"][..]),
        ("mmap2-all", &["--mmap2-buildid-all"][..]),
        ("convert", &["--convert-callchain"][..]),
    ] {
        let out = st.dir.join(format!("out-{form}.data"));
        let (_, report) = pdinject_ok(&defer, &out, flags);
        let d = report_dso(&report, &s(&st.fx.prog)).unwrap();
        assert!(
            d["hits"].as_u64() > Some(0),
            "{form}: {}",
            report_summary(&report)
        );
        ctx_ids.push((form.into(), buildid_list(&p73, &out)));
        if form.starts_with("mmap2") {
            ctx_ids.push((format!("{form} records"), mmap2_build_ids(&p73, &out)));
        }
        // The deferred records pass as they are (the samples' chains too).
        assert_eq!(
            deferred_records(&out),
            deferred_records(&defer),
            "{form}: CALLCHAIN_DEFERRED records changed"
        );
    }
    // In place.
    let inplace = st.dir.join("inplace.data");
    fs::copy(&defer, &inplace).unwrap();
    let o = run(pdinject().arg("--in-place").arg(&inplace));
    assert!(o.status.success(), "{}", tail(&o.stderr));
    ctx_ids.push(("in place".into(), buildid_list(&p73, &inplace)));
    // A stream on stdout, and a stream in.
    let stream = st.dir.join("out.pdata");
    let o = run(pdinject()
        .arg(&defer)
        .arg("-")
        .stdout(Stdio::from(fs::File::create(&stream).unwrap())));
    assert!(o.status.success(), "{}", tail(&o.stderr));
    ctx_ids.push(("stream".into(), received_ids(&p73, &stream)));
    let back = st.dir.join("back.data");
    let o = run(pdinject()
        .arg("-")
        .arg(&back)
        .stdin(Stdio::from(fs::File::open(&stream).unwrap())));
    assert!(o.status.success(), "{}", tail(&o.stderr));
    ctx_ids.push(("stream in".into(), buildid_list(&p73, &back)));
    // Batch.
    let bdir = st.dir.join("batch");
    let o = run(pdinject()
        .args(["batch", "--buildids", "--out-dir"])
        .arg(&bdir)
        .arg(&defer));
    assert!(o.status.success(), "{}", tail(&o.stderr));
    ctx_ids.push(("batch".into(), buildid_list(&p73, &bdir.join("defer.data"))));
    for (ctx, ids) in &ctx_ids {
        assert_ids(&st, ids, ctx);
    }
    Ok(())
}
