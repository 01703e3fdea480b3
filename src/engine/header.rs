//! The recording's own account of itself, assembled from the opening records: a
//! file's header features, or a stream's HEADER_FEATURE records, read into one
//! [`Metadata`] for either; and the recording's start as far as the records tell.

use super::Engine;
use super::dating::RecordingStart;
use crate::format::Endian;
use crate::format::buildid::{BuildIdTable, parse_build_id_table};
use crate::format::feature::{ClockData, parse_clock_data, parse_string};
use crate::format::header::{FEAT_ARCH, FEAT_CLOCK_DATA, FEAT_HOSTNAME, FEAT_OSRELEASE};

/// What the recording says about itself, read once for either input format.
#[derive(Clone, Debug, Default)]
pub(crate) struct Metadata {
    /// HOSTNAME feature.
    pub hostname: Option<String>,
    /// OSRELEASE feature.
    pub release: Option<String>,
    /// ARCH feature.
    pub arch: Option<String>,
    /// CLOCK_DATA feature.
    pub clock: Option<ClockData>,
    /// The input's BUILD_ID table (file format only; a stream carries records).
    pub table: BuildIdTable,
}

impl Metadata {
    /// Reads the features through `feature` (payload by feature bit).
    pub(crate) fn read(
        e: Endian,
        feature: impl Fn(u32) -> Option<Vec<u8>>,
        table: Option<&[u8]>,
    ) -> Self {
        let s = |bit| feature(bit).and_then(|p| parse_string(&p, e));
        Metadata {
            hostname: s(FEAT_HOSTNAME),
            release: s(FEAT_OSRELEASE),
            arch: s(FEAT_ARCH),
            clock: feature(FEAT_CLOCK_DATA).and_then(|p| parse_clock_data(&p, e)),
            table: table
                .map(|t| parse_build_id_table(t, e))
                .unwrap_or_default(),
        }
    }
}

impl Engine<'_> {
    /// The metadata: a file's from its header; a stream's from its HEADER_FEATURE
    /// records, fixed at the first batch that needs them (perf sends them first).
    pub(super) fn metadata(&mut self) -> Metadata {
        let (e, f) = (self.e, &self.head.stream_features);
        self.head
            .meta
            .get_or_insert_with(|| Metadata::read(e, |bit| f.get(&bit).cloned(), None))
            .clone()
    }

    /// The recording's start as far as the records seen so far tell.
    pub(crate) fn start(&self) -> RecordingStart {
        let clock = match &self.head.meta {
            Some(m) => m.clock,
            None => self
                .head
                .stream_features
                .get(&FEAT_CLOCK_DATA)
                .and_then(|p| parse_clock_data(p, self.e)),
        };
        self.origin.dating.start(self.origin.span, clock.as_ref())
    }
}
