//! Property tests of the two reads of a dump: random dumps with lines, unwinding
//! tables (mapped sizes of none, some, all and far too much), loads without code,
//! moves, closes, unknown records, records after the recording's end, times out of
//! order and cuts. The second read of any run of loads gives each load what the
//! first gave it; the image of the kept loads holds, at each kept record's
//! translated offset, the bytes the image of every load holds at its shelf offset;
//! moves find their load's record wherever it is (buffer or file).

use super::*;

/// Pseudo-random numbers (the same every run).
struct G(u64);
impl G {
    fn r(&mut self, m: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % m.max(1)
    }
}

/// Appends a record of id `kind` at `time`.
fn rec(out: &mut Vec<u8>, kind: u32, time: u64, body: &[u8]) {
    out.extend_from_slice(&kind.to_le_bytes());
    out.extend_from_slice(&((16 + body.len()) as u32).to_le_bytes());
    out.extend_from_slice(&time.to_le_bytes());
    out.extend_from_slice(body);
}

/// The recording's end: records after it are late.
const END: u64 = 1_000_000;
const PID: u32 = 4242;

/// A dump's header (version 1, x86-64, no flags) for process `pid`.
fn header(pid: u32) -> Vec<u8> {
    let mut b = Vec::new();
    for v in [0x4A69_5444u32, 1, 40, 62, 0, pid] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    b.extend_from_slice(&[0u8; 16]);
    b
}

/// A random dump (seeds from 1000 on: loads up to 200 KB, so that reads split).
fn build(seed: u64) -> Vec<u8> {
    let mut g = G(seed);
    let mut b = header(PID);
    let mut t = 10u64;
    let mut idx = 0u64;
    let n = 50 + g.r(300);
    for _ in 0..n {
        t += g.r(1000);
        let mut time = t;
        match g.r(10) {
            0 => time = END + 1 + g.r(100),
            1 => time = t.saturating_sub(g.r(3000)),
            _ => {}
        }
        let mut body = Vec::new();
        match g.r(12) {
            0 | 1 => {
                let k = 1 + g.r(4);
                body.extend_from_slice(&(0x1000 + g.r(0x100)).to_le_bytes());
                body.extend_from_slice(&k.to_le_bytes());
                for i in 0..k {
                    body.extend_from_slice(&(0x1000 + g.r(0x100)).to_le_bytes());
                    body.extend_from_slice(&((1 + i + g.r(100)) as i32).to_le_bytes());
                    body.extend_from_slice(&0i32.to_le_bytes());
                    body.extend_from_slice(format!("f{}.js\0", g.r(5)).as_bytes());
                }
                rec(&mut b, 2, time, &body);
            }
            2 | 3 => {
                let usz = 8 + g.r(60);
                let hdr = g.r(usz);
                let mapped = match g.r(4) {
                    0 => 0,
                    1 => usz,
                    2 => usz / 2,
                    _ => 1 << 40,
                };
                body.extend_from_slice(&usz.to_le_bytes());
                body.extend_from_slice(&hdr.to_le_bytes());
                body.extend_from_slice(&mapped.to_le_bytes());
                let v = g.r(256) as u8;
                for i in 0..usz {
                    body.push(v.wrapping_add(i as u8));
                }
                rec(&mut b, 4, time, &body);
            }
            4 => {
                body.extend_from_slice(&PID.to_le_bytes());
                body.extend_from_slice(&7u32.to_le_bytes());
                body.extend_from_slice(&0u64.to_le_bytes());
                body.extend_from_slice(&(0x1000 + g.r(0x400)).to_le_bytes());
                body.extend_from_slice(&(0x1000 + g.r(0x400)).to_le_bytes());
                body.extend_from_slice(&(1 + g.r(50)).to_le_bytes());
                body.extend_from_slice(&g.r(idx + 2).to_le_bytes());
                rec(&mut b, 1, time, &body);
            }
            5 => rec(&mut b, 9, time, &[1, 2, 3]),
            6 => rec(&mut b, 3, time, &[]),
            _ => {
                let csize = if g.r(8) == 0 {
                    0
                } else if seed >= 1000 {
                    1 + g.r(200_000)
                } else {
                    1 + g.r(40)
                };
                body.extend_from_slice(&PID.to_le_bytes());
                body.extend_from_slice(&7u32.to_le_bytes());
                body.extend_from_slice(&0u64.to_le_bytes());
                body.extend_from_slice(&(0x1000 + g.r(0x400)).to_le_bytes());
                body.extend_from_slice(&csize.to_le_bytes());
                body.extend_from_slice(&idx.to_le_bytes());
                body.extend_from_slice(format!("fn{idx}\0").as_bytes());
                let v = g.r(256) as u8;
                for i in 0..csize {
                    body.push(v ^ (i as u8).wrapping_mul(31));
                }
                idx += 1;
                rec(&mut b, 0, time, &body);
            }
        }
    }
    if g.r(3) == 0 {
        let cut = g.r(b.len() as u64 - 40) + 40;
        b.truncate(cut as usize);
    }
    b
}

#[derive(Debug, PartialEq, Clone)]
/// What a load gets from a walk.
struct St {
    code: Vec<u8>,
    lines: Option<(Vec<u8>, u64)>,
    tables: Option<(Vec<u8>, u64, u64)>,
}

/// Each load's group (`at`, `size`) and what it gets, walking `r` up to `stop`.
fn states(r: &mut Reader<impl Read>, stop: u64) -> (Vec<(u64, u64, St)>, Walked) {
    let mut v = Vec::new();
    let w = walk(r, END, stop, Want::Bytes, |s| {
        if let Step::Load(x) = s {
            v.push((
                x.at,
                x.size,
                St {
                    code: x.load.code.to_vec(),
                    lines: x.lines.map(|l| (l.raw.to_vec(), l.count)),
                    tables: x.tables.map(|t| (t.data.to_vec(), t.hdr_size, t.mapped)),
                },
            ));
        }
        Ok(())
    })
    .unwrap();
    (v, w)
}

/// Any run of neighbouring loads read again alone gives each load what the whole
/// dump's first read gave it (its lines and tables come from its own group).
#[test]
fn second_read_state_matches_first() {
    for seed in 0..300 {
        let b = build(seed);
        let mut r = Reader::new(&b[..]).unwrap();
        let h = r.header;
        let (v, _) = states(&mut r, u64::MAX);
        let mut g = G(seed ^ 99);
        for _ in 0..20 {
            if v.is_empty() {
                break;
            }
            let i = g.r(v.len() as u64) as usize;
            let j = i + g.r((v.len() - i) as u64) as usize;
            let from = v[i].0;
            let to = v[j].0 + v[j].1;
            for k in i..j {
                assert_eq!(
                    v[k].0 + v[k].1,
                    v[k + 1].0,
                    "seed {seed}: groups contiguous"
                );
            }
            let buf = &b[from as usize..to as usize];
            let mut r2 = Reader::records(buf, h, from, buf.len());
            let (v2, w2) = states(&mut r2, to);
            assert!(w2.cut.is_none());
            assert_eq!(v2, v[i..=j].to_vec(), "seed {seed} {i}..={j}");
        }
    }
}

/// A recording without DWARF stacks (one shared image).
fn layout() -> Layout {
    Layout {
        endian: Endian::Little,
        stream: false,
        data: (0, 0),
        attrs: vec![],
        clocks: vec![],
        hostname: None,
    }
}

/// A dump's list records.
fn list_of(d: &Dump) -> Vec<MapRec> {
    (0..d.count)
        .map(|i| {
            let mut b = [0u8; MapRec::SIZE];
            d.list
                .read_exact_at(&mut b, i * MapRec::SIZE as u64)
                .unwrap();
            MapRec::decode(&b)
        })
        .collect()
}

/// The first read gives the same records with the image written now or later, and
/// the image of the kept loads (every, half, a tenth or none of the records) maps each
/// kept record to the bytes the image of every load holds for it.
#[test]
fn compact_image_maps_as_full() {
    let l = layout();
    for seed in (0..200).chain(1000..1040) {
        let b = build(seed);
        let da = tempfile::tempdir().unwrap();
        let db = tempfile::tempdir().unwrap();
        let pa = da.path().join(format!("jit-{PID}.dump"));
        let pb = db.path().join(format!("jit-{PID}.dump"));
        std::fs::write(&pa, &b).unwrap();
        std::fs::write(&pb, &b).unwrap();
        let mk = |p: &Path| Marker {
            offset: 0,
            pid: PID,
            time: None,
            path: p.as_os_str().as_encoded_bytes().to_vec(),
        };
        let Ok((a, _)) = make_dump(&mk(&pa), &l, END, Writing::Now) else {
            continue;
        };
        let (mut d, _) = make_dump(&mk(&pb), &l, END, Writing::Later).unwrap();
        let la = list_of(&a);
        let lb = list_of(&d);
        assert_eq!(la.len(), lb.len());
        for (x, y) in la.iter().zip(&lb) {
            assert_eq!(
                (x.time, x.start, x.len, x.pgoff),
                (y.time, y.start, y.len, y.pgoff),
                "seed {seed}"
            );
        }
        let Some(p) = d.pending.take() else { continue };
        let mut g = G(seed + 7);
        let mode = g.r(4);
        let kept: Vec<bool> = (0..d.count)
            .map(|_| match mode {
                0 => true,
                1 => g.r(2) == 0,
                2 => g.r(10) == 0,
                _ => false,
            })
            .collect();
        let notes = write_image(&mut d, &p, Some(&kept), END)
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert!(!notes.is_empty());
        let ia = std::fs::read(&a.image).unwrap();
        let ib = std::fs::read(&d.image).unwrap();
        for (i, r) in lb.iter().enumerate() {
            if !kept[i] || r.pgoff == u64::MAX {
                continue;
            }
            let o = d
                .image_offset(r.pgoff)
                .unwrap_or_else(|| panic!("seed {seed}: rec {i} untranslated"));
            assert_eq!(
                &ib[o as usize..(o + r.len) as usize],
                &ia[r.pgoff as usize..(r.pgoff + r.len) as usize],
                "seed {seed} rec {i}"
            );
        }
    }
}

/// 20,000 loads and moves: a move finds its load's record in the list writer's
/// buffer or, once flushed, in the file.
#[test]
fn moves_find_their_load_past_the_buffer() {
    let mut g = 12345u64;
    let mut r = |m: u64| {
        g = g
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (g >> 33) % m
    };
    let mut b = header(4242);
    let mut t = 1u64;
    let mut idx = 0u64;
    let mut shelf = image::Shelf::default();
    let mut by_idx: HashMap<u64, (u64, u64)> = HashMap::new();
    let mut want = Vec::new();
    for _ in 0..20000 {
        t += 1;
        let mut body = Vec::new();
        if idx > 0 && r(3) == 0 {
            let ci = r(idx);
            let new = 0x10_0000 + r(1 << 20);
            let sz = 1 + r(100);
            for v in [4242u32, 7] {
                body.extend_from_slice(&v.to_le_bytes());
            }
            for v in [0u64, 0, new, sz, ci] {
                body.extend_from_slice(&v.to_le_bytes());
            }
            rec(&mut b, 1, t, &body);
            let (pgoff, len) = by_idx[&ci];
            want.push((t, new, sz.min(len).max(1), pgoff));
        } else {
            let csize = 1 + r(50);
            let addr = 0x10_0000 + r(1 << 20);
            for v in [4242u32, 7] {
                body.extend_from_slice(&v.to_le_bytes());
            }
            for v in [0u64, addr, csize, idx] {
                body.extend_from_slice(&v.to_le_bytes());
            }
            body.extend_from_slice(b"f\0");
            body.extend(std::iter::repeat_n(0x90u8, csize as usize));
            rec(&mut b, 0, t, &body);
            let p = shelf.place(csize, 0);
            by_idx.insert(idx, (p.offset, p.len));
            want.push((t, addr, p.len, p.offset));
            idx += 1;
        }
    }
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("jit-4242.dump");
    std::fs::write(&p, &b).unwrap();
    let m = Marker {
        offset: 0,
        pid: 4242,
        time: None,
        path: p.as_os_str().as_encoded_bytes().to_vec(),
    };
    let (dump, _) = make_dump(&m, &layout(), u64::MAX, Writing::Later).unwrap();
    assert_eq!(dump.count as usize, want.len());
    for i in 0..dump.count {
        let mut x = [0u8; MapRec::SIZE];
        dump.list
            .read_exact_at(&mut x, i * MapRec::SIZE as u64)
            .unwrap();
        let rr = MapRec::decode(&x);
        assert_eq!(
            (rr.time, rr.start, rr.len, rr.pgoff),
            want[i as usize],
            "rec {i}"
        );
    }
}

/// A load written after the recording's end takes the lines before it, as perf
/// gives them, not the next load written on time.
#[test]
fn late_load_leaves_its_lines_to_the_next() {
    let mut b = header(1);
    let mut d = Vec::new();
    d.extend_from_slice(&0x1000u64.to_le_bytes());
    d.extend_from_slice(&1u64.to_le_bytes());
    d.extend_from_slice(&0x1000u64.to_le_bytes());
    d.extend_from_slice(&5i32.to_le_bytes());
    d.extend_from_slice(&0i32.to_le_bytes());
    d.extend_from_slice(b"a.js\0");
    rec(&mut b, 2, 10, &d);
    let load = |addr: u64, ci: u64| {
        let mut x = Vec::new();
        for v in [1u32, 1] {
            x.extend_from_slice(&v.to_le_bytes());
        }
        for v in [0u64, addr, 4, ci] {
            x.extend_from_slice(&v.to_le_bytes());
        }
        x.extend_from_slice(b"f\0\x90\x90\x90\x90");
        x
    };
    rec(&mut b, 0, 2000, &load(0x1000, 0)); // late
    rec(&mut b, 0, 20, &load(0x2000, 1)); // on time, written after
    let mut r = Reader::new(&b[..]).unwrap();
    let mut got = Vec::new();
    walk(&mut r, 1000, u64::MAX, Want::Bytes, |s| {
        if let Step::Load(x) = s {
            got.push((x.load.code_addr, x.lines.is_some()));
        }
        Ok(())
    })
    .unwrap();
    assert_eq!(
        got,
        vec![(0x2000, false)],
        "the late load's lines went to the next load"
    );
}

#[test]
fn a_list_out_of_time_order_is_sorted_stably() {
    let rec = |time, start| MapRec {
        time,
        tid: 1,
        start,
        len: 16,
        pgoff: start,
        img: 0,
        at: start,
        size: 1,
    };
    let recs = [rec(20, 1), rec(10, 2), rec(20, 3), rec(5, 4)];
    let f = tempfile::tempfile().unwrap();
    for (i, r) in recs.iter().enumerate() {
        f.write_all_at(&r.encode(), (i * MapRec::SIZE) as u64)
            .unwrap();
    }
    sort_list_in_runs(&f, recs.len() as u64, 1 << 20, || unreachable!()).unwrap();
    let mut b = [0u8; MapRec::SIZE];
    let got: Vec<u64> = (0..recs.len())
        .map(|i| {
            f.read_exact_at(&mut b, (i * MapRec::SIZE) as u64).unwrap();
            MapRec::decode(&b).start
        })
        .collect();
    assert_eq!(got, vec![4, 2, 1, 3]);
}

#[test]
fn a_long_list_is_sorted_in_runs_stably() {
    let mut x = 99u64;
    let recs: Vec<MapRec> = (0..500u64)
        .map(|i| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            MapRec {
                time: (x >> 33) % 40,
                tid: 1,
                start: i,
                len: 1,
                pgoff: i,
                img: 0,
                at: i * 100,
                size: 100,
            }
        })
        .collect();
    let mut want = recs.clone();
    want.sort_by_key(|r| r.time);
    for run in [1u64, 7, 64, 499, 500] {
        let f = tempfile::tempfile().unwrap();
        for (i, r) in recs.iter().enumerate() {
            f.write_all_at(&r.encode(), (i * MapRec::SIZE) as u64)
                .unwrap();
        }
        sort_list_in_runs(&f, recs.len() as u64, run, tempfile::tempfile).unwrap();
        let mut b = [0u8; MapRec::SIZE];
        let got: Vec<MapRec> = (0..recs.len())
            .map(|i| {
                f.read_exact_at(&mut b, (i * MapRec::SIZE) as u64).unwrap();
                MapRec::decode(&b)
            })
            .collect();
        assert_eq!(got, want, "runs of {run}");
    }
}

/// A walk for heads alone places every load where a walk with the bytes does, and
/// gives neither lines nor tables.
#[test]
fn heads_walk_places_loads_as_a_full_one() {
    let heads = |b: &[u8], want: Want| {
        let mut r = Reader::new(b).unwrap();
        let mut shelf = image::Shelf::default();
        let mut v = Vec::new();
        let w = walk(&mut r, END, u64::MAX, want, |s| {
            if let Step::Load(x) = s {
                if want == Want::Heads {
                    assert!(x.lines.is_none() && x.tables.is_none());
                } else {
                    assert_eq!(x.mapped, x.tables.map_or(0, |t| t.mapped()));
                }
                let p = x.place(&mut shelf);
                v.push((x.time, x.at, x.size, x.load.code_addr, p.offset, p.len));
            }
            Ok(())
        })
        .unwrap();
        (v, w.fingerprint, w.stop, w.late)
    };
    for seed in 0..300 {
        let b = build(seed);
        assert_eq!(
            heads(&b, Want::Heads),
            heads(&b, Want::Bytes),
            "seed {seed}"
        );
    }
}
