//! What the capture reads of a live process and of its mapped files: the process's
//! start time, the mapped inode through `/proc/PID/map_files/START-END` or the
//! process's root, and the inode's identity (device, inode, generation). Clocks:
//! the kernel's monotonic and boot-time clocks and the wall clock, in ns.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// CLOCK_MONOTONIC in ns.
pub(crate) fn mono_ns() -> i128 {
    clock(libc::CLOCK_MONOTONIC)
}

/// The wall clock (CLOCK_REALTIME) in ns since the epoch: the clock of file times.
pub(crate) fn wall_ns() -> i128 {
    clock(libc::CLOCK_REALTIME)
}

/// CLOCK_BOOTTIME minus CLOCK_MONOTONIC now: the time this boot spent suspended so
/// far (0 on most servers). A process start time (boot-time clock) is at most this
/// much later than the same moment on the monotonic clock.
pub(crate) fn suspended_ns() -> i128 {
    (clock(libc::CLOCK_BOOTTIME) - clock(libc::CLOCK_MONOTONIC)).max(0)
}

fn clock(c: libc::clockid_t) -> i128 {
    // SAFETY: clock_gettime writes the timespec.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    if unsafe { libc::clock_gettime(c, &mut ts) } != 0 {
        return 0;
    }
    ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128
}

/// How far behind a file time may be: the resolution of the coarse wall clock the
/// kernel stamps files with (one jiffy: 1 to 10 ms), twice, and 1 ms at least.
pub(crate) fn file_time_slack_ns() -> i128 {
    // SAFETY: clock_getres writes the timespec.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    if unsafe { libc::clock_getres(libc::CLOCK_REALTIME_COARSE, &mut ts) } != 0 {
        return 20_000_000;
    }
    let res = ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128;
    (2 * res).clamp(1_000_000, 20_000_000)
}

/// Nanoseconds of one clock tick of `/proc/PID/stat` (USER_HZ, 100 on Linux).
pub(crate) fn tick_ns() -> i128 {
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 {
        1_000_000_000 / hz as i128
    } else {
        10_000_000
    }
}

/// The start of process `pid` on the boot-time clock in ns, rounded down to a clock
/// tick (field 22 of `/proc/PID/stat`); `None` when there is no such process.
pub(crate) fn start_time(pid: u32) -> Option<i128> {
    let s = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    parse_start(&s).map(|ticks| ticks as i128 * tick_ns())
}

/// Field 22 (starttime) of a `/proc/PID/stat` line. The command name (field 2) is in
/// parentheses and may hold spaces and parentheses itself: fields are counted after
/// the last `)`.
pub(crate) fn parse_start(stat: &[u8]) -> Option<u64> {
    let close = stat.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(stat.get(close + 1..)?).ok()?;
    // After ")": field 3 (state) is the first.
    rest.split_ascii_whitespace().nth(22 - 3)?.parse().ok()
}

/// Raises the soft limit of open files to the hard one (pdinject uses no select(),
/// so a high limit is safe) and returns it.
pub(crate) fn raise_nofile() -> u64 {
    // SAFETY: plain struct filled by getrlimit; setrlimit reads it.
    let mut r: libc::rlimit = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return 1024;
    }
    if r.rlim_cur < r.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: r.rlim_max,
            rlim_max: r.rlim_max,
        };
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            r.rlim_cur = r.rlim_max;
        }
    }
    r.rlim_cur
}

/// Why a mapped file could not be opened.
#[derive(Debug)]
pub(crate) enum OpenError {
    /// map_files needs CAP_SYS_ADMIN (or CAP_CHECKPOINT_RESTORE): fall back.
    NotPermitted,
    /// The process or the mapping is gone (ENOENT, ESRCH).
    Gone,
    /// Not a regular file (a device, a FIFO): never opened for reading.
    NotRegular,
    /// Anything else, in words.
    Other(String),
}

fn open_flags() -> libc::c_int {
    libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC
}

/// Files are first opened with O_PATH (which opens no device and blocks on no
/// FIFO), checked to be regular files, and only then opened for reading, through
/// the O_PATH descriptor (the same inode, not the path again).
fn path_flags() -> libc::c_int {
    libc::O_PATH | libc::O_CLOEXEC
}

/// Opens for reading the regular file `f` (an O_PATH descriptor) is.
fn reopen_regular(f: File) -> Result<File, OpenError> {
    let m = f.metadata().map_err(classify)?;
    if !m.is_file() {
        return Err(OpenError::NotRegular);
    }
    open_path(Path::new(&format!("/proc/self/fd/{}", f.as_raw_fd()))).map_err(classify)
}

fn classify(e: std::io::Error) -> OpenError {
    match e.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => OpenError::NotPermitted,
        Some(libc::ENOENT) | Some(libc::ESRCH) => OpenError::Gone,
        _ => OpenError::Other(e.to_string()),
    }
}

/// Opens the inode mapped at `start..end` in process `pid`. Opening a map_files
/// entry needs CAP_SYS_ADMIN, or CAP_CHECKPOINT_RESTORE since Linux 5.9 (proc(5));
/// without it the error is [`OpenError::NotPermitted`].
pub(crate) fn open_map_file(pid: u32, start: u64, end: u64) -> Result<File, OpenError> {
    let p = format!("/proc/{pid}/map_files/{start:x}-{end:x}");
    reopen_regular(open_with(Path::new(&p), path_flags()).map_err(classify)?)
}

/// Opens `path` (absolute, as recorded) inside the root of process `pid`, resolving
/// every component inside that root (`openat2` with RESOLVE_IN_ROOT: an absolute
/// symlink of a container does not lead out of it); where the kernel has no
/// `openat2`, `/proc/PID/root/PATH` as it resolves. Reaching another process's root
/// needs ptrace read access to it (the same user, or CAP_SYS_PTRACE).
pub(crate) fn open_in_root(pid: u32, path: &[u8]) -> Result<File, OpenError> {
    let root = format!("/proc/{pid}/root");
    let dir = open_dir(Path::new(&root)).map_err(classify)?;
    let rel: &[u8] = {
        let mut p = path;
        while let [b'/', rest @ ..] = p {
            p = rest;
        }
        p
    };
    if rel.is_empty() {
        return Err(OpenError::Other("the recorded path names no file".into()));
    }
    let c = CString::new(rel).map_err(|_| OpenError::Other("a NUL in the path".into()))?;
    // SAFETY: open_how is plain data; zero is "no flags".
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = path_flags() as u64;
    how.resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: openat2 reads the path and the open_how of the size given.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            c.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd >= 0 {
        // SAFETY: a new descriptor that nothing else owns.
        return reopen_regular(unsafe { File::from_raw_fd(fd as libc::c_int) });
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::ENOSYS) {
        return Err(classify(e));
    }
    let mut full = root.into_bytes();
    full.push(b'/');
    full.extend_from_slice(rel);
    let f = open_with(Path::new(std::ffi::OsStr::from_bytes(&full)), path_flags());
    reopen_regular(f.map_err(classify)?)
}

fn open_path(p: &Path) -> std::io::Result<File> {
    open_with(p, open_flags())
}

fn open_with(p: &Path, flags: libc::c_int) -> std::io::Result<File> {
    let c = CString::new(p.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    // SAFETY: a NUL-terminated path.
    let fd = unsafe { libc::open(c.as_ptr(), flags) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor that nothing else owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}

fn open_dir(p: &Path) -> std::io::Result<File> {
    let c = CString::new(p.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    // SAFETY: a NUL-terminated path.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC | libc::O_PATH,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor that nothing else owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// The inode generation, when the filesystem answers FS_IOC_GETVERSION (ext4, xfs,
/// btrfs; tmpfs does not).
pub(crate) fn generation(f: &File) -> Option<u64> {
    const FS_IOC_GETVERSION: libc::c_ulong = 0x8008_7601;
    let mut g: libc::c_long = 0;
    // SAFETY: the ioctl writes one long into `g`.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), FS_IOC_GETVERSION as _, &mut g) };
    (r == 0).then_some(g as u32 as u64)
}

/// Filesystems whose stat() device differs from the device in mmap records
/// (overlayfs, btrfs), as the proof of a local file treats them.
pub(crate) fn device_may_differ(f: &File) -> bool {
    const OVERLAYFS_SUPER_MAGIC: i64 = 0x794c_7630;
    const BTRFS_SUPER_MAGIC: i64 = 0x9123_683e;
    // SAFETY: statfs is a plain struct; fstatfs writes it fully on success.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstatfs(f.as_raw_fd(), &mut st) } != 0 {
        return false;
    }
    let t = st.f_type as i64;
    t == OVERLAYFS_SUPER_MAGIC || t == BTRFS_SUPER_MAGIC
}

/// Bounds of `monotonic - perf clock` (ns) now, measured: a software event of this
/// process records one anonymous data mapping of its own (a PERF_RECORD_MMAP stamped
/// by the clock perf record's events use, the kernel's local clock), between two
/// reads of the monotonic clock. (Anonymous and not executable: a system-wide
/// recording, which sees it too, takes it for no DSO's mapping.) `None` when perf_event_open is not permitted (it needs
/// perf_event_paranoid <= 2, which lets a process watch its own user-space events,
/// or CAP_PERFMON) or the record is not seen.
pub(crate) fn perf_clock_offset() -> Option<(i128, i128)> {
    // perf_event_attr, the 128-byte version: type SOFTWARE, config SW_DUMMY,
    // sample_type TIME, flags exclude_kernel, exclude_hv, mmap, mmap_data,
    // sample_id_all.
    let mut attr = [0u8; 128];
    attr[0..4].copy_from_slice(&1u32.to_ne_bytes());
    attr[4..8].copy_from_slice(&128u32.to_ne_bytes());
    attr[8..16].copy_from_slice(&9u64.to_ne_bytes());
    attr[24..32].copy_from_slice(&(1u64 << 2).to_ne_bytes());
    let flags: u64 = (1 << 5) | (1 << 6) | (1 << 8) | (1 << 17) | (1 << 18);
    attr[40..48].copy_from_slice(&flags.to_ne_bytes());
    // SAFETY: the attr buffer outlives the call; the result is a new descriptor.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            attr.as_ptr(),
            0 as libc::pid_t,
            -1 as libc::c_int,
            -1 as libc::c_int,
            8 as libc::c_ulong, // PERF_FLAG_FD_CLOEXEC
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: a new descriptor that nothing else owns.
    let event = unsafe { File::from_raw_fd(fd as libc::c_int) };
    let page = 4096usize.max(unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize);
    let len = 2 * page;
    // SAFETY: maps the event's ring buffer (one header page, one data page).
    let ring = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            event.as_raw_fd(),
            0,
        )
    };
    if ring == libc::MAP_FAILED {
        return None;
    }
    let mut best: Option<(i128, i128)> = None;
    {
        for _ in 0..3 {
            let before = mono_ns();
            // SAFETY: a fresh private anonymous page, unmapped below.
            let at = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    page,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            let after = mono_ns();
            if at == libc::MAP_FAILED {
                break;
            }
            // SAFETY: the mapping made above.
            unsafe { libc::munmap(at, page) };
            // SAFETY: the ring is mapped for `len` bytes while we read it.
            let t = unsafe { mmap_time(ring.cast::<u8>(), page, at as u64) };
            if let Some(t) = t {
                let b = (before - t as i128, after - t as i128);
                if best.is_none_or(|(lo, hi)| b.1 - b.0 < hi - lo) {
                    best = Some(b);
                }
            }
        }
    }
    // SAFETY: unmaps the ring mapped above.
    unsafe { libc::munmap(ring, len) };
    best
}

/// The time of the MMAP record for address `addr` in a ring buffer of one header
/// page and one data page (sample_type TIME: the trailer is the time).
///
/// # Safety
/// `ring` must point to the mapped ring of `2 * page` bytes.
unsafe fn mmap_time(ring: *const u8, page: usize, addr: u64) -> Option<u64> {
    // perf_event_mmap_page: data_head at 1024 (read with acquire ordering).
    let head = unsafe { std::ptr::read_volatile(ring.add(1024).cast::<u64>()) };
    std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
    let data = unsafe { std::slice::from_raw_parts(ring.add(page), page) };
    let head = head as usize;
    if head > page {
        return None;
    }
    let mut off = 0usize;
    while off + 8 <= head {
        let kind = u32::from_ne_bytes(data[off..off + 4].try_into().ok()?);
        let size = u16::from_ne_bytes(data[off + 6..off + 8].try_into().ok()?) as usize;
        if size < 8 || off + size > head {
            return None;
        }
        let rec = &data[off..off + size];
        if kind == 1 && size >= 48 && u64::from_ne_bytes(rec[16..24].try_into().ok()?) == addr {
            return Some(u64::from_ne_bytes(rec[size - 8..].try_into().ok()?));
        }
        off += size;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_is_field_22_after_the_name() {
        let line =
            b"4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1234 56";
        assert_eq!(parse_start(line), Some(987654));
        assert_eq!(parse_start(b"1 (x) S 0"), None);
        assert_eq!(parse_start(b"garbage"), None);
        let own = start_time(std::process::id()).expect("own stat");
        assert!(own >= 0 && own <= clock(libc::CLOCK_BOOTTIME));
    }

    #[test]
    fn perf_clock_offset_is_narrow_when_permitted() {
        if let Some((lo, hi)) = perf_clock_offset() {
            assert!(lo <= hi && hi - lo < 50_000_000, "{lo} {hi}");
        }
    }

    #[test]
    fn own_mapping_through_map_files_or_root() {
        // The test binary's own first mapping is its executable.
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let line = maps.lines().find(|l| l.contains(" r-xp ")).unwrap();
        let (range, rest) = line.split_once(' ').unwrap();
        let (a, b) = range.split_once('-').unwrap();
        let (a, b) = (
            u64::from_str_radix(a, 16).unwrap(),
            u64::from_str_radix(b, 16).unwrap(),
        );
        let path = rest.split_ascii_whitespace().nth(4).unwrap();
        let pid = std::process::id();
        use std::os::unix::fs::MetadataExt;
        let want = std::fs::metadata(path).unwrap().ino();
        match open_map_file(pid, a, b) {
            Ok(f) => assert_eq!(f.metadata().unwrap().ino(), want),
            Err(OpenError::NotPermitted) => {}
            Err(e) => panic!("{e:?}"),
        }
        let f = open_in_root(pid, path.as_bytes()).unwrap();
        assert_eq!(f.metadata().unwrap().ino(), want);
        assert!(matches!(
            open_map_file(pid, 0x1000, 0x2000),
            Err(OpenError::Gone | OpenError::NotPermitted)
        ));
    }
}
