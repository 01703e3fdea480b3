//! Walking PERF_SAMPLE_CALLCHAIN entries with their context markers (perf-format.md
//! §4.4). perf discards a whole chain at a marker it does not know; pdinject instead
//! stops at it, keeping the host DSOs already found (never a wrong one: each address
//! was looked up in the space its marker named).

/// Which address space an entry belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Space {
    /// The host kernel.
    Kernel,
    /// The sampled process.
    User,
}

/// Markers are the top 4095 values of u64.
pub(crate) const CONTEXT_MAX: u64 = (-4095i64) as u64;
const HV: u64 = (-32i64) as u64;
const KERNEL: u64 = (-128i64) as u64;
const USER: u64 = (-512i64) as u64;
const USER_DEFERRED: u64 = crate::format::record::CONTEXT_USER_DEFERRED;
const GUEST: u64 = (-2048i64) as u64;
const GUEST_KERNEL: u64 = (-2176i64) as u64;
const GUEST_USER: u64 = (-2560i64) as u64;

/// Calls `f` with the space and address of every host entry of a callchain.
pub(crate) fn walk(entries: impl Iterator<Item = u64>, mut f: impl FnMut(Space, u64)) {
    // perf starts in user mode when no marker precedes the first entry.
    let mut space = Some(Space::User);
    let mut skip_cookie = false;
    for ip in entries {
        if skip_cookie {
            skip_cookie = false;
            continue;
        }
        if ip >= CONTEXT_MAX {
            space = match ip {
                KERNEL => Some(Space::Kernel),
                USER => Some(Space::User),
                HV | GUEST | GUEST_KERNEL | GUEST_USER => None,
                USER_DEFERRED => {
                    // A cookie follows; the user part arrives in a later
                    // CALLCHAIN_DEFERRED record, which the resolve reads as the
                    // user addresses of its own process (resolve::Resolver).
                    skip_cookie = true;
                    None
                }
                _ => return,
            };
            continue;
        }
        if let Some(s) = space {
            f(s, ip);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_switch_spaces_and_guest_parts_are_skipped() {
        let chain = [
            KERNEL,
            0xffffffff81000010,
            USER,
            0x401000,
            GUEST_USER,
            0x999,
            USER,
            0x402000,
        ];
        let mut got = Vec::new();
        walk(chain.into_iter(), |s, a| got.push((s, a)));
        assert_eq!(
            got,
            vec![
                (Space::Kernel, 0xffffffff81000010),
                (Space::User, 0x401000),
                (Space::User, 0x402000)
            ]
        );
    }

    #[test]
    fn unknown_marker_stops() {
        let mut n = 0;
        walk([USER, 1, u64::MAX - 5, 2].into_iter(), |_, _| n += 1);
        assert_eq!(n, 1);
    }
}
