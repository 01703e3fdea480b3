//! The fuzz targets' bodies, one function a target (fuzz/fuzz_targets/*.rs call them
//! with the fuzzer's bytes). They live here so that a fuzzer reaches one entry point,
//! not the rooms' parts: the unwinder, the sample decoder, the note reader and the
//! jitdump reader stay crate-private. Each asserts the invariants of its room; a
//! failed assertion is the finding.

use crate::buildid::elf::{build_id_from_notes, build_id_of_image};
use crate::buildid::{LocalFiles, RecordingStart};
use crate::format::Endian;
use crate::format::attr::Attr;
use crate::format::buildid::parse_build_id_table;
use crate::format::jitdump::{Reader, Record, lines};
use crate::format::record::{FileIdent, Mmap, misc};
use crate::format::sample::{SampleLayout, sample_id, u64s};
use crate::model::{Key, Model, ModelBuilder};
use crate::resolve::callchain;
use crate::resolve::unwind::{
    Arch, SampleStack, UnwindConfig, UnwindMode, UnwindTables, Worker, unwind as unwind_one,
};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// The `n`-th little-endian word of `d` (the caller checked the length).
fn word(d: &[u8], n: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[n * 8..n * 8 + 8]);
    u64::from_le_bytes(b)
}

/// The fuzz process's own executable mappings as a model, with the unwind tables of
/// their files, and the mappings' ranges.
struct OwnMaps {
    model: Model,
    tables: UnwindTables,
    ranges: Vec<(u64, u64)>,
}

fn own_maps() -> &'static OwnMaps {
    static S: OnceLock<OwnMaps> = OnceLock::new();
    S.get_or_init(|| {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
        let mut b = ModelBuilder::new();
        let mut ranges = Vec::new();
        for (i, line) in maps.lines().enumerate() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 6 || !f[1].contains('x') || !f[5].starts_with('/') {
                continue;
            }
            let Some((a, z)) = f[0].split_once('-') else {
                continue;
            };
            let (Ok(a), Ok(z), Ok(pgoff)) = (
                u64::from_str_radix(a, 16),
                u64::from_str_radix(z, 16),
                u64::from_str_radix(f[2], 16),
            ) else {
                continue;
            };
            let m = Mmap {
                pid: 1,
                tid: 1,
                start: a,
                len: z - a,
                pgoff,
                ident: FileIdent::None,
                prot: 5,
                flags: 2,
                filename: f[5].as_bytes(),
            };
            // Over the model budget: the rest of the maps are left out.
            if b.mmap(Key::new(0, i as u64), misc::USER, &m).is_err() {
                break;
            }
            ranges.push((a, z));
        }
        let model = b.build();
        let mut tables = UnwindTables::default();
        tables.grow(&model);
        // Times never make a file stale here: the fuzzer drives the unwinder.
        tables.set_proof(LocalFiles::Trusted, RecordingStart::Known(i128::MAX));
        OwnMaps {
            model,
            tables,
            ranges,
        }
    })
}

/// The unwinder's input: registers and a user-stack copy from the fuzzer, unwound
/// with real CFI (this process's own executable and the libc it maps) in both
/// architectures' register sets, with the frame cap and budget of a normal run.
pub fn unwind(data: &[u8]) {
    if data.len() < 40 {
        return;
    }
    let st = own_maps();
    if st.ranges.is_empty() {
        return;
    }
    static WORKERS: OnceLock<Mutex<(Worker, Worker)>> = OnceLock::new();
    let workers =
        WORKERS.get_or_init(|| Mutex::new((Worker::new(Arch::X86_64), Worker::new(Arch::Aarch64))));
    let Ok(mut w) = workers.lock() else { return };
    // The IP lands in a real executable mapping (an offset picked by the input), so
    // real CFI is evaluated; SP, BP/FP, LR and the stack bytes are the fuzzer's.
    let (a, z) = st.ranges[word(data, 0) as usize % st.ranges.len()];
    let ip = a + word(data, 1) % (z - a).max(1);
    let (sp, fp, lr) = (word(data, 2), word(data, 3), word(data, 4));
    let stack = &data[40..];
    let cfg = |arch| UnwindConfig {
        mode: UnwindMode::Dwarf,
        arch,
        budget: Duration::from_millis(1),
        max_frames: 512,
    };
    // x86_64 registers by perf number: BP 6, SP 7, IP 8.
    let x86_mask: u64 = (1 << 6) | (1 << 7) | (1 << 8);
    let x86_regs: Vec<u8> = [fp, sp, ip].iter().flat_map(|v| v.to_le_bytes()).collect();
    // aarch64: X29 29, LR 30, SP 31, PC 32.
    let arm_mask: u64 = (1 << 29) | (1 << 30) | (1 << 31) | (1 << 32);
    let arm_regs: Vec<u8> = [fp, lr, sp, ip]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let mut n = 0usize;
    let (wx, wa) = &mut *w;
    for (arch, worker, mask, regs) in [
        (Arch::X86_64, wx, x86_mask, &x86_regs),
        (Arch::Aarch64, wa, arm_mask, &arm_regs),
    ] {
        let s = SampleStack {
            pid: 1,
            key: Key::new(0, u64::MAX),
            regs_mask: mask,
            regs,
            stack,
            e: Endian::Little,
        };
        let o = unwind_one(&cfg(arch), &st.model, &st.tables, worker, &s, &mut |_| {
            n += 1
        });
        assert!(o.frames <= 512);
    }
    assert!(n <= 2 * 513);
}

/// An attr derived from the first 32 bytes, the rest decoded as a SAMPLE record in
/// both byte orders, and every decoded callchain walked.
pub fn sample(data: &[u8]) {
    if data.len() < 32 {
        return;
    }
    let (head, rec) = data.split_at(32);
    let attr = Attr {
        kind: 0,
        size: 128,
        config: 0,
        sample_type: word(head, 0),
        read_format: word(head, 1),
        flags: 0,
        branch_sample_type: word(head, 2),
        sample_regs_user: word(head, 3),
        sample_stack_user: 0,
        clockid: 0,
        sample_regs_intr: 0,
        ids: Vec::new(),
    };
    let layout = SampleLayout::new(&attr);
    for e in [Endian::Little, Endian::Big] {
        std::hint::black_box(sample_id(rec, e, attr.sample_type));
        if let Ok(s) = layout.decode(rec, e) {
            let mut n = 0u64;
            callchain::walk(u64s(s.callchain, e), |_, ip| n = n.wrapping_add(ip));
            // Branch entries are {from, to, flags}: walk the from/to addresses too.
            let mut it = u64s(s.branches, e);
            while let (Some(from), Some(to), Some(_)) = (it.next(), it.next(), it.next()) {
                n = n.wrapping_add(from ^ to);
            }
            assert!(s.stack_user.len() <= rec.len());
            assert!(s.regs_user.len() <= rec.len());
            std::hint::black_box(n);
        }
    }
    // The raw bytes as a callchain too (arbitrary markers in arbitrary order).
    callchain::walk(u64s(rec, Endian::Little), |_, ip| {
        std::hint::black_box(ip);
    });
}

/// ELF images, raw note streams and BUILD_ID feature tables.
pub fn notes(data: &[u8]) {
    if let Ok(id) = build_id_of_image(data) {
        std::hint::black_box(id);
    }
    if let Some(id) = build_id_from_notes(data) {
        assert!(id.as_bytes().len() <= 20);
    }
    for e in [Endian::Little, Endian::Big] {
        std::hint::black_box(parse_build_id_table(data, e));
    }
}

/// A jitdump file (a JIT's own output, read by `--jit`): the header, every record,
/// the line entries of DEBUG_INFO records. Every record's bytes lie within the input.
pub fn jitdump(data: &[u8]) {
    let Ok(mut r) = Reader::new(data) else {
        return;
    };
    let swapped = r.swapped();
    // A dump's records are bounded by its size; the cap only guards the fuzzer's time.
    for _ in 0..10_000 {
        let Ok(Some(e)) = r.next_entry() else {
            break;
        };
        assert!(e.offset <= data.len() as u64);
        match e.record {
            Record::Load(l) => assert!(l.code.len() <= data.len()),
            Record::Debug { count, raw, .. } => {
                assert!(raw.len() <= data.len());
                for l in lines(raw, count, swapped) {
                    assert!(l.name.is_none_or(|n| n.len() <= raw.len()));
                }
            }
            Record::Unwinding(u) => assert!(u.data.len() <= data.len()),
            Record::Move(_) | Record::Close | Record::Unknown(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    /// Every entry over the repository's own inputs and their prefixes: the bodies
    /// run (and compile) with the tests, not only under cargo-fuzz.
    #[test]
    fn the_fuzz_entries_take_real_and_cut_inputs() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let demo = std::fs::read(root.join("testdata/demo/demo.data")).expect("the demo");
        let own = std::fs::read("/proc/self/exe").expect("this test's own binary");
        for data in [
            &demo[..],
            &own[..4096],
            &own[..],
            &[0u8; 64][..],
            &[0xffu8; 200][..],
        ] {
            for cut in [data.len(), data.len() / 2, 41, 33, 0] {
                let d = &data[..cut.min(data.len())];
                super::unwind(d);
                super::sample(d);
                super::notes(d);
                super::jitdump(d);
            }
        }
    }
}
