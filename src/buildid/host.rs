//! The machine pdinject runs on, and whether a recording was made on it: only then may
//! local files, the kernel's notes, module notes and the vdso speak for the recording.

use super::elf::{build_id_from_notes, build_id_of_image};
use crate::format::buildid::BuildId;

/// Facts about the running host.
#[derive(Clone, Debug, Default)]
pub(crate) struct HostInfo {
    /// `uname -n`.
    pub hostname: String,
    /// `uname -r`.
    pub release: String,
}

impl HostInfo {
    /// Reads hostname and release.
    pub(crate) fn detect() -> HostInfo {
        // SAFETY: uname fills the struct on success.
        let mut u: libc::utsname = unsafe { std::mem::zeroed() };
        if unsafe { libc::uname(&mut u) } != 0 {
            return HostInfo::default();
        }
        let s = |f: &[libc::c_char]| {
            let b: Vec<u8> = f
                .iter()
                .take_while(|&&c| c != 0)
                .map(|&c| c as u8)
                .collect();
            String::from_utf8_lossy(&b).into_owned()
        };
        HostInfo {
            hostname: s(&u.nodename),
            release: s(&u.release),
        }
    }
}

/// Address of `sym` in this boot's kernel (needs privileges: 0 reads as unknown).
/// /proc/kallsyms is generated as it is read and is large; `_text` and `_stext` sit
/// near its start, so reading stops at the first match.
pub(crate) fn kernel_symbol(sym: &str) -> Option<u64> {
    use std::io::BufRead;
    let f = std::fs::File::open("/proc/kallsyms").ok()?;
    for line in std::io::BufReader::with_capacity(1 << 16, f).lines() {
        let line = line.ok()?;
        let mut it = line.split_whitespace();
        let (Some(addr), Some(_), Some(name)) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        if name == sym {
            let a = u64::from_str_radix(addr, 16).ok()?;
            return (a != 0).then_some(a);
        }
    }
    None
}

/// The running kernel's build ID.
pub(crate) fn kernel_build_id() -> Option<BuildId> {
    build_id_from_notes(&std::fs::read("/sys/kernel/notes").ok()?)
}

/// A loaded module's build ID.
pub(crate) fn module_build_id(name: &str) -> Option<BuildId> {
    let p = format!("/sys/module/{name}/notes/.note.gnu.build-id");
    build_id_from_notes(&std::fs::read(p).ok()?)
}

/// The module name perf's path or `[name]` stands for (dashes become underscores).
pub(crate) fn module_name(dso_name: &str) -> Option<String> {
    let base = if let Some(n) = dso_name.strip_prefix('[').and_then(|n| n.strip_suffix(']')) {
        n
    } else {
        let b = dso_name.rsplit('/').next()?;

        [".ko.zst", ".ko.xz", ".ko.gz", ".ko"]
            .iter()
            .find_map(|s| b.strip_suffix(s))?
    };
    (!base.is_empty()).then(|| base.replace('-', "_"))
}

/// This process's vdso image, as perf dumps it into the build-ID cache: the whole
/// `[vdso]` mapping of /proc/self/maps.
pub(crate) fn vdso_image() -> Option<&'static [u8]> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let line = maps.lines().find(|l| l.ends_with("[vdso]"))?;
    let range = line.split_whitespace().next()?;
    let (a, b) = range.split_once('-')?;
    let (a, b) = (
        u64::from_str_radix(a, 16).ok()?,
        u64::from_str_radix(b, 16).ok()?,
    );
    if b <= a || b - a > 1 << 20 {
        return None;
    }
    // SAFETY: the kernel maps the vdso readable into every process for its lifetime;
    // the range comes from our own /proc/self/maps.
    Some(unsafe { std::slice::from_raw_parts(a as *const u8, (b - a) as usize) })
}

/// The build ID of this process's own vdso (the running kernel's).
pub(crate) fn vdso_build_id() -> Option<BuildId> {
    build_id_of_image(vdso_image()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_names() {
        assert_eq!(
            module_name("/lib/modules/6.1/kernel/drivers/x/nf-tables.ko.xz").as_deref(),
            Some("nf_tables")
        );
        assert_eq!(module_name("[ext4]").as_deref(), Some("ext4"));
        assert_eq!(module_name("/usr/lib/libc.so.6"), None);
    }
}
