//! Removing every temp output when the process is killed by a signal (SIGINT, SIGTERM,
//! SIGHUP, SIGQUIT, SIGXFSZ), so that not even a hidden partial file or directory is
//! left behind; and on SIGBUS (the input was truncated while mapped) the same, then
//! "input FILE changed size while being read" and exit status 1.
//!
//! The handlers only do async-signal-safe things: open, getdents64, unlinkat, rmdir,
//! close, unlink, write, sigaction, raise, _exit. SIGPIPE is left ignored (Rust's
//! default): a closed stdout is an EPIPE error, and the error path removes the temps.
//!
//! A room of its own: the input names itself here when it is opened, and the
//! writer watches its temp outputs here; it imports nothing of either.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicPtr, Ordering};

/// Temp outputs alive at once (output, report; a few more for library users).
const SLOTS: usize = 16;

#[allow(clippy::declare_interior_mutable_const)]
const NULL: AtomicPtr<libc::c_char> = AtomicPtr::new(std::ptr::null_mut());
/// Watched paths; bit 0 of a pointer (always clear in an allocation's address)
/// marks a directory.
static PENDING: [AtomicPtr<libc::c_char>; SLOTS] = [NULL; SLOTS];
/// The SIGBUS message, prepared when the input is opened.
static BUS_MESSAGE: AtomicPtr<libc::c_char> = AtomicPtr::new(std::ptr::null_mut());

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
/// remove_dir_all allocate, which a signal handler must not).
///
/// # Safety
/// `path` is a NUL-terminated path.
unsafe fn remove_dir(path: *const libc::c_char) {
    // SAFETY: raw system calls on a buffer on this stack.
    unsafe {
        let fd = libc::open(path, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC);
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
        libc::rmdir(path);
    }
}

extern "C" fn on_signal(sig: libc::c_int) {
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

/// Names the input in the SIGBUS message (called when the input is opened).
pub fn input_opened(path: &Path) {
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
