//! Deciding what a batch may use: whether this host may speak for the recording
//! (host trust, refused while the recording cannot be dated) and how user stacks are
//! walked (the unwind configuration), each decided once per input.

use super::dating::RecordingStart;
use super::{Engine, Host, Metadata};
use crate::buildid::host::HostInfo;
use crate::buildid::{HostTrust, Reason};
use crate::format::attr::st;
use crate::options::UnwindChoice;
use crate::resolve::unwind::{Arch, UnwindConfig, UnwindMode};

impl Engine<'_> {
    /// Host trust for this batch: decided once from the metadata and the kernel map;
    /// local files are refused, with their own reason, while the recording cannot be
    /// dated.
    pub(super) fn effective_trust(
        &mut self,
        meta: &Metadata,
        kernel_ref: Option<&(String, u64)>,
        start: &RecordingStart,
    ) -> HostTrust {
        let trust = match &self.origin.trust {
            Some(t) => t.clone(),
            None => self
                .origin
                .trust
                .insert(self.decide_trust(meta, kernel_ref))
                .clone(),
        };
        batch_trust(trust, start)
    }

    /// Host trust from the metadata and the kernel reference map.
    pub(super) fn decide_trust(
        &self,
        meta: &Metadata,
        kernel_ref: Option<&(String, u64)>,
    ) -> HostTrust {
        match self.origin.host {
            Host::Closed => {
                let no = || Err((Reason::OtherHost, "the host was not consulted".to_string()));
                HostTrust {
                    local: no(),
                    kernel: no(),
                }
            }
            Host::Consult => HostTrust::decide(
                meta.hostname.as_deref(),
                meta.release.as_deref(),
                kernel_ref.map(|(s, a)| (s.as_str(), *a)),
                &HostInfo::detect(),
            ),
        }
    }

    /// How user stacks are walked, decided once from `--unwind`, the events and ARCH.
    pub(super) fn unwind_config(&mut self, meta: &Metadata) -> Option<UnwindConfig> {
        if let Some(c) = self.res.unwind {
            return c;
        }
        let has_stacks = self
            .head
            .attrs
            .iter()
            .any(|a| a.sample_type & st::STACK_USER != 0 && a.sample_type & st::REGS_USER != 0);
        let choice = match (self.cx.opts.unwind.how, has_stacks) {
            (UnwindChoice::None, _) | (UnwindChoice::Auto, false) => None,
            (choice, _) => Some(choice),
        };
        let arch = meta.arch.as_deref();
        let cfg = choice.and_then(|choice| match arch.and_then(Arch::from_perf) {
            Some(arch) => Some(UnwindConfig {
                mode: if choice == UnwindChoice::Fp {
                    UnwindMode::Fp
                } else {
                    UnwindMode::Dwarf
                },
                arch,
                // A conversion's chains must not depend on load: only the frame cap
                // ends them (docs/convert.md).
                budget: match self.cx.opts.callchains {
                    crate::options::Callchains::AsRecorded => self.cx.opts.unwind.budget,
                    crate::options::Callchains::Converted => std::time::Duration::MAX,
                },
                max_frames: self.cx.opts.unwind.max_frames,
            }),
            None => {
                if has_stacks {
                    self.said.notes.push(format!(
                        "user stacks are not unwound: architecture {} is not supported (x86_64, aarch64)",
                        arch.unwrap_or("unknown")
                    ));
                }
                None
            }
        });
        self.res.unwind = Some(cfg);
        cfg
    }
}

/// Host trust for one batch: while the recording cannot be dated, local files are
/// refused as `undated`; every other refusal (another host, another boot) keeps its
/// own reason.
pub(super) fn batch_trust(trust: HostTrust, start: &RecordingStart) -> HostTrust {
    match start {
        RecordingStart::Unknown(why) if trust.local.is_ok() => HostTrust {
            local: Err((Reason::Undated, why.clone())),
            ..trust
        },
        _ => trust,
    }
}
