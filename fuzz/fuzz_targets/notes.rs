//! ELF images, raw note streams and BUILD_ID feature tables.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pdinject::testing::buildid::{build_id_from_notes, build_id_of_image};
use pdinject::testing::format::Endian;
use pdinject::testing::format::parse_build_id_table;

fuzz_target!(|data: &[u8]| {
    if let Ok(id) = build_id_of_image(data) {
        std::hint::black_box(id);
    }
    if let Some(id) = build_id_from_notes(data) {
        assert!(id.as_bytes().len() <= 20);
    }
    for e in [Endian::Little, Endian::Big] {
        std::hint::black_box(parse_build_id_table(data, e));
    }
});
