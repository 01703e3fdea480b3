//! Removing every temp output when the process is killed by a signal (SIGINT, SIGTERM,
//! SIGHUP, SIGQUIT, SIGXFSZ), so that not even a hidden partial file or directory is
//! left behind; and on SIGBUS (the input was truncated while mapped) the same, then
//! "input FILE changed size while being read" and exit status 1.
//!
//! The handlers only do async-signal-safe things: open, rename, getdents64, unlinkat,
//! rmdir, close, unlink, write, sigaction, raise, _exit. SIGPIPE is left ignored
//! (Rust's default): a closed stdout is an EPIPE error, and the error path removes the
//! temps.
//!
//! Other threads go on while a handler runs: a temp directory (a `--threads`
//! output's) is renamed away before it is emptied, so a part another thread creates
//! by path meanwhile fails instead of landing in it after the listing (which left the
//! directory behind). A section that must not be cut (the in-place writer, between
//! its journal and the journal's removal) holds [`defer`]: a signal then waits for
//! the section's end.
//!
//! A room of its own: the input names itself here when it is opened, and the
//! writer watches its temp outputs here; it imports nothing of either.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicUsize, Ordering};

/// Temp outputs alive at once (output, report, the build-ID cache's and the symbol
/// store's temporary names of the threads filling them; more are removed by their
/// owners, or by a later run).
const SLOTS: usize = 64;

#[allow(clippy::declare_interior_mutable_const)]
const NULL: AtomicPtr<libc::c_char> = AtomicPtr::new(std::ptr::null_mut());
/// Watched paths; bit 0 of a pointer (always clear in an allocation's address)
/// marks a directory.
static PENDING: [AtomicPtr<libc::c_char>; SLOTS] = [NULL; SLOTS];
/// The SIGBUS message, prepared when the input is opened.
static BUS_MESSAGE: AtomicPtr<libc::c_char> = AtomicPtr::new(std::ptr::null_mut());

/// Sections in which a signal waits ([`defer`]); the signal that arrived in one.
static DEFERRING: AtomicUsize = AtomicUsize::new(0);
static DEFERRED: AtomicI32 = AtomicI32::new(0);

/// Removes every watched temp output (async-signal-safe).
fn remove_all() {
    for slot in PENDING.iter() {
        let tagged = slot.swap(std::ptr::null_mut(), Ordering::SeqCst);
        if tagged.is_null() {
            continue;
        }
        let dir = tagged as usize & 1 != 0;
        let p = (tagged as usize & !1) as *const libc::c_char;
        // SAFETY: `p` came from CString::into_raw and is never freed once taken
        // here (the handler leaks it); the calls are async-signal-safe.
        unsafe {
            if dir {
                remove_dir(p);
            } else {
                libc::unlink(p);
            }
        }
    }
}

/// Empties and removes a temp directory with raw system calls (readdir and
/// remove_dir_all allocate, which a signal handler must not). The directory is first
/// renamed to `PATH.gone`: a thread still writing the output creates its files by
/// path, and one created after the listing below would keep the directory from
/// going (a `--threads` output's copier makes `data.N` one after another).
///
/// # Safety
/// `path` is a NUL-terminated path.
unsafe fn remove_dir(path: *const libc::c_char) {
    const GONE: &[u8] = b".gone\0";
    let mut buf = [0u8; 4096];
    // SAFETY: `path` is NUL-terminated; the copy stays inside `buf`.
    let target = unsafe {
        let n = libc::strlen(path);
        if n + GONE.len() <= buf.len() {
            std::ptr::copy_nonoverlapping(path.cast::<u8>(), buf.as_mut_ptr(), n);
            buf[n..n + GONE.len()].copy_from_slice(GONE);
            if libc::rename(path, buf.as_ptr().cast()) == 0 {
                buf.as_ptr().cast()
            } else {
                path
            }
        } else {
            path
        }
    };
    // SAFETY: raw system calls on a buffer on this stack.
    unsafe {
        let fd = libc::open(target, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC);
        if fd >= 0 {
            let mut buf = [0u8; 4096];
            // Read the directory to its end, then again while a pass removed
            // something (removal under an open listing may skip entries); a
            // bounded number of passes, so a handler can never spin.
            let mut removed = false;
            let mut passes = 0;
            loop {
                let n = libc::syscall(libc::SYS_getdents64, fd, buf.as_mut_ptr(), buf.len());
                if n <= 0 {
                    if n == 0 && removed && passes < 16 {
                        libc::lseek(fd, 0, libc::SEEK_SET);
                        removed = false;
                        passes += 1;
                        continue;
                    }
                    break;
                }
                let mut off = 0usize;
                while off + 19 < n as usize {
                    // struct linux_dirent64: u64 ino, i64 off, u16 reclen, u8 type, name.
                    let reclen = u16::from_ne_bytes([buf[off + 16], buf[off + 17]]) as usize;
                    if reclen == 0 {
                        break;
                    }
                    let name = buf.as_ptr().add(off + 19) as *const libc::c_char;
                    let dot = *name == b'.' as libc::c_char
                        && (*name.add(1) == 0
                            || (*name.add(1) == b'.' as libc::c_char && *name.add(2) == 0));
                    if !dot && libc::unlinkat(fd, name, 0) == 0 {
                        removed = true;
                    }
                    off += reclen;
                }
            }
            libc::close(fd);
        }
        hooks::after_listing();
        libc::rmdir(target);
    }
}

extern "C" fn on_signal(sig: libc::c_int) {
    if DEFERRING.load(Ordering::SeqCst) > 0 {
        // A section that must not be cut: it ends, then dies of this signal.
        DEFERRED.store(sig, Ordering::SeqCst);
        return;
    }
    remove_all();
    // SAFETY: sigaction-free reset and raise are async-signal-safe.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

extern "C" fn on_bus(_sig: libc::c_int) {
    remove_all();
    let m = BUS_MESSAGE.load(Ordering::SeqCst);
    // SAFETY: `m` is null or a CString that is never freed; write and _exit are
    // async-signal-safe.
    unsafe {
        if m.is_null() {
            const M: &[u8] = b"pdinject: the input changed size while being read\n";
            libc::write(2, M.as_ptr().cast(), M.len());
        } else {
            libc::write(2, m.cast(), libc::strlen(m));
        }
        libc::_exit(1);
    }
}

/// Installs the handlers (the binary calls this once at start).
pub fn install() {
    for sig in [
        libc::SIGINT,
        libc::SIGTERM,
        libc::SIGHUP,
        libc::SIGQUIT,
        libc::SIGXFSZ,
    ] {
        set(sig, on_signal as *const () as libc::sighandler_t);
    }
    set(libc::SIGBUS, on_bus as *const () as libc::sighandler_t);
}

fn set(sig: libc::c_int, handler: libc::sighandler_t) {
    // SAFETY: a zeroed sigaction with a handler that only does async-signal-safe work.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(sig, &sa, std::ptr::null_mut());
    }
}

/// A section during which SIGINT, SIGTERM, SIGHUP, SIGQUIT and SIGXFSZ wait: held by
/// the in-place writer from its journal to the journal's removal, so a Ctrl-C leaves
/// the file whole in its new state and no journal, rather than a journal for the next
/// run to undo. When the last guard goes, a signal that came meanwhile removes the
/// temp outputs and ends the process as it would have.
pub(crate) fn defer() -> Deferred {
    DEFERRING.fetch_add(1, Ordering::SeqCst);
    Deferred(())
}

/// See [`defer`].
pub(crate) struct Deferred(());

impl Drop for Deferred {
    fn drop(&mut self) {
        if DEFERRING.fetch_sub(1, Ordering::SeqCst) == 1 {
            let sig = DEFERRED.swap(0, Ordering::SeqCst);
            if sig != 0 {
                on_signal(sig);
            }
        }
    }
}

/// Whether a signal is waiting for a [`defer`] section to end.
#[cfg(feature = "test-hooks")]
pub(crate) fn deferred() -> bool {
    DEFERRED.load(Ordering::SeqCst) != 0
}

/// Test hooks (the `test-hooks` feature; a release build has none and never reads
/// the variable): `PDINJECT_TEST_PAUSE_AT=POINT` stops the run at a named point, says
/// so on stderr (`pdinject: paused at POINT`) and waits there to be signalled, so a
/// test sends its signal at a known moment instead of after a guessed delay.
///
/// Points: `commit` (the output and the report written, not yet renamed: every temp
/// output exists), `in-place` (inside the in-place writer's journaled section; it
/// goes on once a signal waits), `cache` (a build-ID cache entry written under its
/// temporary name), and `dir-part`: a `--threads` output's copier about to create a
/// `data.N` part; it waits until a signal handler has listed the temp directory and
/// then creates the part, while the handler waits before its rmdir: the interleaving
/// that used to leave the directory behind, made certain.
pub(crate) mod hooks {
    #[cfg(feature = "test-hooks")]
    use std::sync::atomic::{AtomicBool, Ordering};

    #[cfg(feature = "test-hooks")]
    static RACE_ARMED: AtomicBool = AtomicBool::new(false);
    #[cfg(feature = "test-hooks")]
    static RACE_LISTED: AtomicBool = AtomicBool::new(false);
    #[cfg(feature = "test-hooks")]
    static RACE_DONE: AtomicBool = AtomicBool::new(false);

    #[cfg(feature = "test-hooks")]
    fn wanted(point: &str) -> bool {
        static ONCE: AtomicBool = AtomicBool::new(false);
        std::env::var("PDINJECT_TEST_PAUSE_AT").is_ok_and(|p| p == point)
            && !ONCE.swap(true, Ordering::SeqCst)
    }

    #[cfg(feature = "test-hooks")]
    fn announce(point: &str) {
        use std::io::Write;
        let mut e = std::io::stderr().lock();
        let _ = writeln!(e, "pdinject: paused at {point}");
        let _ = e.flush();
    }

    /// Stops at `point` until a signal ends the process (or, inside a [`super::defer`]
    /// section, until one waits for it).
    #[cfg(feature = "test-hooks")]
    pub(crate) fn pause(point: &str) {
        if !wanted(point) {
            return;
        }
        announce(point);
        while !super::deferred() {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    #[cfg(not(feature = "test-hooks"))]
    pub(crate) fn pause(_: &str) {}

    /// The `dir-part` point, before `part` (a `data.N` file of a temp directory) is
    /// created: see the module's words.
    #[cfg(feature = "test-hooks")]
    pub(crate) fn before_part(part: &std::path::Path) {
        let is_part = part
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("data."));
        if !is_part || !wanted("dir-part") {
            return;
        }
        RACE_ARMED.store(true, Ordering::SeqCst);
        announce("dir-part");
        while !RACE_LISTED.load(Ordering::SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        // Created by path, as the copier does.
        let _ = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(part);
        RACE_DONE.store(true, Ordering::SeqCst);
        // The handler ends the process.
        loop {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    #[cfg(not(feature = "test-hooks"))]
    pub(crate) fn before_part(_: &std::path::Path) {}

    /// In the handler, between a temp directory's listing and its rmdir: with the
    /// `dir-part` point armed, lets the copier create its part and waits (at most 5 s)
    /// until it has. Async-signal-safe: atomics and nanosleep.
    #[cfg(feature = "test-hooks")]
    pub(super) fn after_listing() {
        if !RACE_ARMED.load(Ordering::SeqCst) {
            return;
        }
        RACE_LISTED.store(true, Ordering::SeqCst);
        let ms = libc::timespec {
            tv_sec: 0,
            tv_nsec: 1_000_000,
        };
        for _ in 0..5000 {
            if RACE_DONE.load(Ordering::SeqCst) {
                break;
            }
            // SAFETY: nanosleep with a valid timespec is async-signal-safe.
            unsafe { libc::nanosleep(&ms, std::ptr::null_mut()) };
        }
    }

    #[cfg(not(feature = "test-hooks"))]
    pub(super) fn after_listing() {}
}

/// Names the input in the SIGBUS message (called when the input is opened).
pub(crate) fn input_opened(path: &Path) {
    let msg = format!(
        "pdinject: input {} changed size while being read\n",
        path.display()
    );
    if let Ok(c) = CString::new(msg) {
        // The old message is leaked: a handler may be reading it.
        BUS_MESSAGE.store(c.into_raw(), Ordering::SeqCst);
    }
}

/// Watches a temp path; the slot is given back with [`unwatch`].
pub(crate) fn watch(path: &Path, is_dir: bool) -> Option<usize> {
    let c = CString::new(path.as_os_str().as_bytes()).ok()?.into_raw();
    if c as usize & 1 != 0 {
        free(c);
        return None;
    }
    let tagged = (c as usize | is_dir as usize) as *mut libc::c_char;
    for (i, slot) in PENDING.iter().enumerate() {
        if slot
            .compare_exchange(
                std::ptr::null_mut(),
                tagged,
                Ordering::SeqCst,
                Ordering::SeqCst,
            )
            .is_ok()
        {
            return Some(i);
        }
    }
    free(c);
    None
}

/// Stops watching (the temp was committed or removed by its owner).
pub(crate) fn unwatch(slot: usize) {
    if let Some(p) = PENDING.get(slot) {
        let tagged = p.swap(std::ptr::null_mut(), Ordering::SeqCst);
        free((tagged as usize & !1) as *mut libc::c_char);
    }
}

fn free(p: *mut libc::c_char) {
    if !p.is_null() {
        // SAFETY: only pointers from CString::into_raw are stored.
        drop(unsafe { CString::from_raw(p) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::write::TempOutput;
    use std::sync::Mutex;

    /// The forked children see every watched path: one test at a time.
    static ONE: Mutex<()> = Mutex::new(());

    /// Forks; the child runs `child` (async-signal-safe calls only: the test harness
    /// has other threads) and must not return. Returns the child's wait status.
    fn in_child(child: impl FnOnce()) -> libc::c_int {
        // SAFETY: fork; the child only makes async-signal-safe calls, then _exit.
        unsafe {
            let pid = libc::fork();
            assert!(pid >= 0, "fork failed");
            if pid == 0 {
                child();
                libc::_exit(99);
            }
            let mut st = 0;
            assert_eq!(libc::waitpid(pid, &mut st, 0), pid);
            st
        }
    }

    #[test]
    fn a_signal_removes_temp_files_and_directories() {
        let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
        let dir = tempfile::tempdir().unwrap();
        let out_dir = TempOutput::create(&dir.path().join("out.data"), true).unwrap();
        for i in 0..300 {
            std::fs::write(out_dir.path.join(format!("data.{i}")), b"x").unwrap();
        }
        let out_file = TempOutput::create(&dir.path().join("out2.data"), false).unwrap();
        let st = in_child(|| {
            install();
            // SAFETY: raise is async-signal-safe.
            unsafe { libc::raise(libc::SIGTERM) };
        });
        assert!(
            libc::WIFSIGNALED(st) && libc::WTERMSIG(st) == libc::SIGTERM,
            "{st:#x}"
        );
        assert!(!out_dir.path.exists(), "temp directory left");
        assert!(!out_file.path.exists(), "temp file left");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    /// A signal inside a deferred section waits for its end, then removes the temps
    /// and ends the process by that signal; a directory is renamed away before it is
    /// emptied.
    #[test]
    fn a_deferred_signal_acts_when_the_section_ends() {
        let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
        let dir = tempfile::tempdir().unwrap();
        let out = TempOutput::create(&dir.path().join("out.data"), false).unwrap();
        let out_dir = TempOutput::create(&dir.path().join("outdir"), true).unwrap();
        std::fs::write(out_dir.path.join("data.0"), b"x").unwrap();
        let witness = dir.path().join("witness");
        let w = std::ffi::CString::new(witness.to_str().unwrap()).unwrap();
        let st = in_child(|| {
            install();
            let guard = defer();
            // SAFETY: raise and open are async-signal-safe; the handler only records
            // the signal here.
            unsafe {
                libc::raise(libc::SIGHUP);
                // Still alive inside the section: leave a witness.
                let fd = libc::open(w.as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o600);
                libc::close(fd);
            }
            drop(guard);
        });
        assert!(
            libc::WIFSIGNALED(st) && libc::WTERMSIG(st) == libc::SIGHUP,
            "{st:#x}"
        );
        assert!(witness.exists(), "the signal did not wait for the section");
        assert!(!out.path.exists() && !out_dir.path.exists(), "temps left");
        std::fs::remove_file(&witness).unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn sigbus_from_a_truncated_input_cleans_up_and_says_so() {
        use std::os::fd::AsRawFd;
        let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in.data");
        std::fs::write(&input, vec![7u8; 3 * 4096]).unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&input)
            .unwrap();
        // SAFETY: a read-only map of our own file, truncated only in the child.
        let map = unsafe { memmap2::Mmap::map(&f).unwrap() };
        input_opened(&input);
        let out = TempOutput::create(&dir.path().join("out.data"), false).unwrap();
        let err = dir.path().join("stderr");
        let errf = std::fs::File::create(&err).unwrap();
        let (fd, efd, p) = (f.as_raw_fd(), errf.as_raw_fd(), map.as_ptr());
        let st = in_child(|| {
            install();
            // SAFETY: dup2, ftruncate and a volatile read of the map are
            // async-signal-safe; the read past the new end raises SIGBUS.
            unsafe {
                libc::dup2(efd, 2);
                libc::ftruncate(fd, 0);
                std::ptr::read_volatile(p.add(2 * 4096));
            }
        });
        assert!(libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 1, "{st:#x}");
        assert!(!out.path.exists(), "temp file left");
        let msg = std::fs::read_to_string(&err).unwrap();
        assert!(
            msg.contains("changed size while being read") && msg.contains("in.data"),
            "{msg}"
        );
    }
}
