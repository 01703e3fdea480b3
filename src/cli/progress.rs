//! The progress bar on terminals (single runs and batches).

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A bar of `len` bytes on stderr drawn by `template`, or `None` when it would not be
/// seen (`quiet`, or stderr is no terminal).
pub(crate) fn bar(quiet: bool, len: u64, template: &str) -> Option<ProgressBar> {
    use std::io::IsTerminal;
    if quiet || !std::io::stderr().is_terminal() {
        return None;
    }
    let b = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    b.set_style(
        ProgressStyle::with_template(template)
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    Some(b)
}
