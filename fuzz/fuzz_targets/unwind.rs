//! The unwinder's input: registers and a user-stack copy from the fuzzer, unwound with
//! real CFI (the fuzz binary itself and the libc it maps, taken from
//! /proc/self/maps) in both architectures' register sets, with the frame cap and
//! budget of a normal run.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pdinject::testing::buildid::{LocalFiles, RecordingStart};
use pdinject::testing::format::Endian;
use pdinject::testing::format::{FileIdent, Mmap, misc};
use pdinject::testing::model::{Key, Model, ModelBuilder};
use pdinject::testing::resolve::{
    Arch, SampleStack, UnwindConfig, UnwindMode, UnwindTables, Worker, unwind,
};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

struct State {
    model: Model,
    tables: UnwindTables,
    ranges: Vec<(u64, u64)>,
}

fn state() -> &'static State {
    static S: OnceLock<State> = OnceLock::new();
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
        State {
            model,
            tables,
            ranges,
        }
    })
}

fn word(d: &[u8], i: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[i * 8..i * 8 + 8]);
    u64::from_le_bytes(b)
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 40 {
        return;
    }
    let st = state();
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
    let sp = word(data, 2);
    let fp = word(data, 3);
    let lr = word(data, 4);
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
        let o = unwind(&cfg(arch), &st.model, &st.tables, worker, &s, &mut |_| {
            n += 1
        });
        assert!(o.frames <= 512);
    }
    assert!(n <= 2 * 513);
});
