//! Feature sections: the strings and clock data used to tell whose machine a
//! recording was made on and when (the BUILD_ID table is in `buildid`).

use super::Endian;

/// Reads a perf header string (`{u32 len; char s[len]}`), the form of HOSTNAME,
/// OSRELEASE, ARCH and friends.
pub fn parse_string(payload: &[u8], e: Endian) -> Option<String> {
    let len = e.u32(payload, 0)? as usize;
    let s = payload.get(4..4usize.checked_add(len)?)?;
    Some(String::from_utf8_lossy(super::c_str(s)).into_owned())
}

/// CLOCK_DATA: a pair of readings of the sampling clock and of wall-clock time taken
/// together, which turns sample times into wall-clock times.
#[derive(Clone, Copy, Debug)]
pub struct ClockData {
    /// Wall-clock time in ns since the epoch.
    pub wall_ns: u64,
    /// The sampling clock's time at the same moment.
    pub clock_ns: u64,
}

/// Parses CLOCK_DATA (`u32 version; u32 clockid; u64 wall_clock_ns; u64 clockid_time_ns`).
pub fn parse_clock_data(payload: &[u8], e: Endian) -> Option<ClockData> {
    if e.u32(payload, 0)? != 1 {
        return None;
    }
    Some(ClockData {
        wall_ns: e.u64(payload, 8)?,
        clock_ns: e.u64(payload, 16)?,
    })
}
