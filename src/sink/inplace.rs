//! `--in-place`: the table sink's BUILD_ID section and the MMAP2 sink's records,
//! written into the input itself through the crash-safe plan of
//! [`crate::write::inplace`]. Only what changes is written.
//!
//! * `--buildids`, `--buildid-all`: a new BUILD_ID payload past the end of the file
//!   and the feature table entries that point at it (plus the header's bitmap when
//!   the file had no table).
//! * `--mmap2-buildid-all`, `--mmap2-buildids`: mapping records that keep their size
//!   are rewritten where they are (MMAP records, which would grow, are left); the
//!   table takes only the IDs no record carries (the kernel and modules behind MMAP
//!   records, the vdso, records in compressed data), and the feature tail is written
//!   over itself with it ([`crate::write::fit`]), so the file keeps its size. When
//!   the tail has no room for it, the table is appended as above, and the report
//!   says by how much the file grew.

use super::mmap2::{Splice, carried_by_records, mapping_note, plan as mmap2_plan, read_record};
use super::table::{table_plan, table_plan_where};
use super::{Batch, Begin, Facts, Sink, SinkReport};
use crate::error::{Error, Result};
use crate::format::header::{FEAT_BUILD_ID, Section};
use crate::input::PerfInput;
use crate::options::Form;
use crate::report::{InPlaceReport, TableWrite};
use crate::write::fit::fit_tail;
use crate::write::inplace::{Change, Plan, apply};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

/// Rewrites a file-format input in place.
pub(crate) struct InplaceSink {
    form: Form,
    report: SinkReport,
}

impl InplaceSink {
    /// The IDs are written in `form` ([`Form::Mmap2`]: mapping records in build-ID
    /// form too).
    pub(crate) fn new(form: Form) -> Self {
        InplaceSink {
            form,
            report: SinkReport::default(),
        }
    }
}

/// The changes that give `input` the BUILD_ID section `payload`: the payload past
/// the end of the file; when the file had no BUILD_ID section, the feature table
/// grows by one entry over the first bytes after it, so whatever feature payload
/// lay there is copied past the end too, and the bitmap gains the bit.
pub(crate) fn tail_changes(input: &PerfInput, payload: Vec<u8>, plan: &mut Plan) -> Result<()> {
    let h = &input.header;
    let e = h.endian;
    let name = &input.header_path;
    let data_end = h.feature_table_offset();
    let old_bits: Vec<u32> = h.feature_bits().collect();
    let mut sections: BTreeMap<u32, Section> = input.features.iter().copied().collect();
    if sections.len() != old_bits.len() || !old_bits.iter().all(|b| sections.contains_key(b)) {
        return Err(Error::unsupported(
            "the feature table does not match the header's bitmap; write a new file instead of --in-place",
        )
        .in_file(name));
    }
    let had = sections.contains_key(&FEAT_BUILD_ID);
    // Appends start past the old end and past the (grown) table, which a file whose
    // features are all empty ends with.
    let table_end = data_end + 16 * (sections.len() as u64 + u64::from(!had));
    let mut end = input.file_len.max(table_end);
    sections.insert(
        FEAT_BUILD_ID,
        Section {
            offset: end,
            size: payload.len() as u64,
        },
    );
    let n = sections.len() as u64;
    plan.appends.push(Change {
        offset: end,
        bytes: payload,
    });
    end += sections[&FEAT_BUILD_ID].size;
    if had {
        let idx = sections
            .keys()
            .position(|&b| b == FEAT_BUILD_ID)
            .unwrap_or(0) as u64;
        let s = sections[&FEAT_BUILD_ID];
        let mut entry = e.put_u64(s.offset).to_vec();
        entry.extend_from_slice(&e.put_u64(s.size));
        plan.switch.push(Change {
            offset: data_end + 16 * idx,
            bytes: entry,
        });
        return Ok(());
    }
    // The table grows from `old_end` to `new_end`: what lay there moves.
    let (old_end, new_end) = (data_end + 16 * (n - 1), data_end + 16 * n);
    let hit = |s: &Section| s.size > 0 && s.offset < new_end && s.offset + s.size > old_end;
    if hit(&h.attrs) {
        return Err(Error::unsupported(
            "the attrs section follows the feature table; write a new file instead of --in-place",
        )
        .in_file(name));
    }
    for ids in input.ids_sections()? {
        if hit(&ids) {
            return Err(Error::unsupported(
                "an ids section follows the feature table; write a new file instead of --in-place",
            )
            .in_file(name));
        }
    }
    let bits: Vec<u32> = sections.keys().copied().collect();
    for bit in bits {
        let s = sections[&bit];
        if bit != FEAT_BUILD_ID && hit(&s) {
            let bytes = input.data_files[0].read_at(s.offset, s.size)?;
            sections.insert(
                bit,
                Section {
                    offset: end,
                    size: s.size,
                },
            );
            plan.appends.push(Change { offset: end, bytes });
            end += s.size;
        }
    }
    let mut table = Vec::with_capacity(16 * n as usize);
    for s in sections.values() {
        table.extend_from_slice(&e.put_u64(s.offset));
        table.extend_from_slice(&e.put_u64(s.size));
    }
    let mut features = h.features;
    features[0] |= 1 << FEAT_BUILD_ID;
    plan.switch.push(Change {
        offset: data_end,
        bytes: table,
    });
    plan.switch.push(Change {
        offset: 72,
        bytes: h.encode_bitmap(&features).to_vec(),
    });
    Ok(())
}

/// The changes that write the new feature tail `tail` over the old one (only the
/// bytes that differ), and the header's bitmap when the file had no BUILD_ID
/// section: the switch, journaled like every overwrite.
fn fit_changes(input: &PerfInput, tail: Vec<u8>, had: bool, plan: &mut Plan) -> Result<()> {
    let h = &input.header;
    let data_end = h.feature_table_offset();
    let old = input.data_files[0].read_at(data_end, tail.len() as u64)?;
    let first = old.iter().zip(&tail).position(|(a, b)| a != b);
    let last = old.iter().zip(&tail).rposition(|(a, b)| a != b);
    if let (Some(a), Some(b)) = (first, last) {
        plan.switch.push(Change {
            offset: data_end + a as u64,
            bytes: tail[a..=b].to_vec(),
        });
    }
    if !had {
        let mut features = h.features;
        features[0] |= 1 << FEAT_BUILD_ID;
        plan.switch.push(Change {
            offset: 72,
            bytes: h.encode_bitmap(&features).to_vec(),
        });
    }
    Ok(())
}

/// The DSOs given new table entries, for the summary (a few names, then a count).
fn table_names(facts: &Facts<'_>, need: &[bool]) -> String {
    let names: Vec<String> = facts
        .decisions()
        .enumerate()
        .filter(|(i, d)| need.get(*i).copied().unwrap_or(true) && d.id_for_table().is_some())
        .map(|(_, d)| d.group.name.clone())
        .collect();
    match names.len() {
        0 => "no new entries".into(),
        1..=3 => names.join(", "),
        n => format!("{}, ... ({n} entries)", names[..3].join(", ")),
    }
}

impl Sink for InplaceSink {
    fn begin(&mut self, begin: &Begin<'_>, _: &Arc<AtomicBool>) -> Result<()> {
        match begin {
            Begin::File(input) if !input.is_dir && !input.header.data_size_repaired => Ok(()),
            Begin::File(input) if input.is_dir => Err(Error::Usage(format!(
                "{}: --in-place takes a perf.data file, not a --threads directory",
                input.path.display()
            ))),
            Begin::File(input) => Err(Error::unsupported(
                "the data size in the header is 0 (the recording was not finished); write a new file instead of --in-place",
            )
            .in_file(&input.header_path)),
            Begin::Stream { .. } => Err(Error::Usage(
                "--in-place takes a file-format perf.data (a stream cannot gain records in place); write a new file".into(),
            )),
        }
    }

    fn batch(&mut self, batch: &Batch<'_>, facts: &Facts<'_>) -> Result<()> {
        let Batch::File { input, .. } = batch else {
            return Err(Error::Internal("in-place sink: stream bytes".into()));
        };
        let t = Instant::now();
        let mut plan = Plan::default();
        // mmap2 modes: which decisions still need a table entry (no record carries
        // their ID).
        let mut need: Option<Vec<bool>> = None;
        if self.form == Form::Mmap2 {
            let splices: Vec<Splice> =
                mmap2_plan(facts, facts.mapping_records, true, false, &mut |f, o| {
                    read_record(input, f, o)
                })
                .into_iter()
                .filter(|s| s.file == 0 && s.grows() == 0)
                .collect();
            let carried = carried_by_records(facts, &splices, &mut |f, o| read_record(input, f, o));
            need = Some(carried.iter().map(|c| !c).collect());
            plan.records = splices
                .into_iter()
                .map(|s| Change {
                    offset: s.offset,
                    bytes: s.new,
                })
                .collect();
            self.report
                .notes
                .push(mapping_note(plan.records.len() as u64, 0));
        }
        let tp = match &need {
            Some(n) => table_plan_where(input, facts, &|i, _| n.get(i).copied().unwrap_or(true)),
            None => table_plan(input, facts),
        };
        self.report.ids_new = tp.ids_new;
        self.report.ids_lost = tp.ids_lost;
        self.report.notes.extend(tp.note);
        let had = input.header.has_feature(FEAT_BUILD_ID);
        let mut ip = InPlaceReport {
            table: TableWrite::Unchanged,
            grew: false,
            grew_bytes: 0,
            strings_repadded: 0,
            ids_in_records: need
                .as_ref()
                .map_or(0, |n| n.iter().filter(|&&x| !x).count()),
            no_room: None,
        };
        match tp.payload.filter(|_| tp.write) {
            // Every ID is in a record: no table to add.
            Some(p) if need.is_some() && p.is_empty() && !had => {}
            Some(payload) if need.is_some() => match fit_tail(input, &payload)? {
                Ok(fit) => {
                    fit_changes(input, fit.tail, had, &mut plan)?;
                    ip.table = TableWrite::Rewritten;
                    ip.strings_repadded = fit.repadded;
                    let names = table_names(facts, need.as_deref().unwrap_or_default());
                    self.report.notes.push(format!(
                        "in place: the BUILD_ID table ({names}: what no mapping record carries) written over the feature tail{}; the file keeps its size",
                        match fit.repadded {
                            0 => String::new(),
                            n => format!(", {n} header strings re-padded from 64 bytes to 8"),
                        }
                    ));
                }
                Err(why) => {
                    ip.no_room = Some(why.to_string());
                    tail_changes(input, payload, &mut plan)?;
                    ip.table = TableWrite::Appended;
                }
            },
            Some(payload) => {
                tail_changes(input, payload, &mut plan)?;
                ip.table = TableWrite::Appended;
            }
            None => {}
        }
        ip.grew_bytes = plan
            .appends
            .iter()
            .map(|c| c.offset + c.bytes.len() as u64)
            .max()
            .map_or(0, |end| end.saturating_sub(input.file_len));
        ip.grew = ip.grew_bytes > 0;
        if let Some(why) = &ip.no_room {
            self.report.notes.push(format!(
                "in place: {why}; the BUILD_ID table was appended instead: the file grew by {} bytes",
                ip.grew_bytes
            ));
        }
        if plan.is_empty() {
            self.report
                .notes
                .push("in place: nothing to change, the file was not written".into());
        }
        apply(&input.header_path, &plan)?;
        self.report.in_place = Some(ip);
        self.report.timings.insert("write-in-place", t.elapsed());
        Ok(())
    }

    fn finish(&mut self, _: &Facts<'_>) -> Result<SinkReport> {
        Ok(std::mem::take(&mut self.report))
    }
}
