//! perf's configuration (perfconfig): the few values pdinject reads as perf would,
//! `buildid.dir` (where the build-ID cache is) and `buildid-cache.debuginfod`.

use std::path::PathBuf;

/// `section.key` of perf's configuration: `$HOME/.perfconfig` over
/// `/etc/perfconfig` (skipped with PERF_CONFIG_NOSYSTEM, as perf does).
pub(crate) fn value(section: &str, key: &str) -> Option<String> {
    let mut files = Vec::new();
    if std::env::var_os("PERF_CONFIG_NOSYSTEM").is_none() {
        files.push(PathBuf::from("/etc/perfconfig"));
    }
    if let Some(h) = std::env::var_os("HOME") {
        files.push(PathBuf::from(h).join(".perfconfig"));
    }
    let mut found = None;
    for f in files {
        if let Ok(text) = std::fs::read_to_string(&f)
            && let Some(v) = value_in(&text, section, key)
        {
            found = Some(v);
        }
    }
    found
}

/// The last `section.key` value of a git-style config text (perf's perfconfig).
pub(crate) fn value_in(text: &str, section: &str, key: &str) -> Option<String> {
    let mut in_section = false;
    let mut found = None;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(rest) = line.strip_prefix('[') {
            let name = rest.split(']').next().unwrap_or("").trim();
            in_section = name.eq_ignore_ascii_case(section);
            continue;
        }
        if !in_section {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        if !k.trim().eq_ignore_ascii_case(key) {
            continue;
        }
        let mut v = v.trim();
        // A trailing comment, then quotes.
        if !v.starts_with('"')
            && let Some(i) = v.find([' ', '\t'])
            && v[i..].trim_start().starts_with(['#', ';'])
        {
            v = v[..i].trim_end();
        }
        if v.len() >= 2 && v.starts_with('"') && v.ends_with('"') {
            v = &v[1..v.len() - 1];
        }
        found = Some(v.to_string());
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_of_a_config_text() {
        let t =
            "# c\n[core]\n dir = x\n[buildid]\n\tdir = /a/b ; comment\n[BuildID]\nDir = \"/c d\"\n";
        assert_eq!(value_in(t, "buildid", "dir").as_deref(), Some("/c d"));
        assert_eq!(
            value_in("[buildid]\ndir=/x\n", "buildid", "dir").as_deref(),
            Some("/x")
        );
        assert_eq!(value_in("[other]\ndir=/x\n", "buildid", "dir"), None);
    }
}
