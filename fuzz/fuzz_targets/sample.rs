//! An attr derived from the first 32 bytes, the rest decoded as a SAMPLE record in
//! both byte orders, and every decoded callchain walked.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pdinject::testing::format::Attr;
use pdinject::testing::format::Endian;
use pdinject::testing::format::{SampleLayout, u64s};
use pdinject::testing::resolve as callchain;

fn word(d: &[u8], i: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[i * 8..i * 8 + 8]);
    u64::from_le_bytes(b)
}

fuzz_target!(|data: &[u8]| {
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
        let _ = pdinject::testing::format::sample_id(rec, e, attr.sample_type);
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
});
