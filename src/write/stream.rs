//! Records written into a stream (pipe mode): HEADER_BUILD_ID.

use crate::format::Endian;
use crate::format::feature::{BuildId, encode_table_entry};
use crate::format::record::rt;

/// Appends a HEADER_BUILD_ID record for `name` in the modern form (the same bytes as
/// a table entry, typed as a record; no sample-id trailer, which perf 6.1 does not
/// expect). False (nothing written) when perf could not read the name back: longer
/// than [`crate::limits::MAX_DSO_NAME`] (perf reads it into a PATH_MAX buffer).
pub fn build_id_record(
    out: &mut Vec<u8>,
    e: Endian,
    cpumode: u16,
    id: &BuildId,
    name: &[u8],
) -> bool {
    let at = out.len();
    if !encode_table_entry(out, e, cpumode, id, name) {
        return false;
    }
    out[at..at + 4].copy_from_slice(&e.put_u32(rt::HEADER_BUILD_ID));
    true
}
